/* Hash of dQ, dK, dV (and O, L) for a set of problems, bf16 inputs, every precision
 * mode, both schedules, one ISA: run it against two builds and diff. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tilegrad.h"
static double rnd(unsigned *s){*s=*s*1103515245u+12345u;return ((*s>>8)&0xffff)/65536.0*2-1;}
static uint16_t tob(float f){uint32_t u;memcpy(&u,&f,4);u+=0x7fff+((u>>16)&1);return u>>16;}
static uint64_t fnv(const void *p, size_t n){const unsigned char*c=p;uint64_t h=1469598103934665603ull;for(size_t i=0;i<n;i++){h^=c[i];h*=1099511628211ull;}return h;}
static void run(const char *isa,int prec,int sched,int threads,int B,int H,int Hkv,int qL,int kL,int D,int causal,int W){
  tg_ctx*ctx; tg_ctx_create(&ctx); tg_ctx_set_threads(ctx,threads);
  for(int i=0;i<tg_isa_count();i++) if(!strcmp(tg_isa_name(tg_isa_at(i)),isa)) tg_ctx_set_isa(ctx,tg_isa_at(i));
  tg_ctx_set_attn_schedule(ctx,sched); tg_ctx_set_attn_precision(ctx,prec);
  tg_attn_params p; tg_attn_params_init(&p,B,H,Hkv,qL,kL,D,1.0f/sqrtf(D));
  size_t nq=(size_t)B*H*qL, nk=(size_t)B*Hkv*kL;
  uint16_t *Q=malloc(2*nq*D),*K=malloc(2*nk*D),*V=malloc(2*nk*D),*dO=malloc(2*nq*D);
  float *O=malloc(4*nq*D),*L=malloc(4*nq),*Dv=malloc(4*nq),*dQ=malloc(4*nq*D),*dK=malloc(4*nk*D),*dV=malloc(4*nk*D);
  unsigned s=777; for(size_t i=0;i<nq*D;i++){Q[i]=tob(rnd(&s)*2);dO[i]=tob(rnd(&s));} for(size_t i=0;i<nk*D;i++){K[i]=tob(rnd(&s)*2);V[i]=tob(rnd(&s));}
  tg_attn_options opt={0}; opt.flags=TG_ATTN_OPT_O_F32; opt.window=W;
  int st=tg_attn_train_fwd(ctx,TG_DTYPE_BF16,Q,K,V,O,L,&p,NULL,NULL,causal,&opt);
  if(!st) st=tg_attn_train_bwd_compute_d(ctx,TG_DTYPE_F32,O,dO==dO?(void*)O:0,Dv,B,H,qL,D); /* D = rowsum(O*O): any fixed vector */
  memset(dQ,0xff,4*nq*D); memset(dK,0,4*nk*D); memset(dV,0,4*nk*D);
  if(!st) st=tg_attn_train_bwd(ctx,TG_DTYPE_BF16,Q,K,V,L,dO,Dv,dQ,dK,dV,&p,NULL,NULL,causal,&opt);
  printf("%s prec%d sch%d t%d %d,%d,%d,%d,%d,%d,c%d,W%d: st %d O %016llx dQ %016llx dK %016llx dV %016llx\n",isa,prec,sched,threads,B,H,Hkv,qL,kL,D,causal,W,st,
    (unsigned long long)fnv(O,4*nq*D),(unsigned long long)fnv(dQ,4*nq*D),(unsigned long long)fnv(dK,4*nk*D),(unsigned long long)fnv(dV,4*nk*D));
  free(Q);free(K);free(V);free(dO);free(O);free(L);free(Dv);free(dQ);free(dK);free(dV); tg_ctx_destroy(ctx);
}
int main(int argc,char**argv){ const char*isa=argc>1?argv[1]:"amx";
  for(int prec=0;prec<3;prec++) for(int sch=0;sch<2;sch++) for(int th=1;th<=3;th+=2){ if(sch==TG_ATTN_SCHEDULE_ATOMIC&&th>1) continue;
    run(isa,prec,sch,th,1,4,2,333,333,128,1,0);
    run(isa,prec,sch,th,1,6,2,517,600,256,1,0);
    run(isa,prec,sch,th,2,4,1,300,300,64,0,0);
    run(isa,prec,sch,th,1,8,2,777,777,128,0,0);
    run(isa,prec,sch,th,1,2,2,1024,1024,512,1,0);
    run(isa,prec,sch,th,1,4,4,700,700,96,1,128);
    run(isa,prec,sch,th,1,3,1,257,901,160,0,0);
  }
  return 0; }
