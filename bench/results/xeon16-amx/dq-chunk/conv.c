/* Costs around the bf16-mode pair of the backward, one core: the three
 * conversions of a BQ x BK f32 tile (row split, transposed split) against
 * an AVX-512 row-pair interleave (two rows -> (a,b) pairs, RNE as
 * bf16_rne_lanes), and the five tile products of a 128 x 128 pair. ns per
 * call, medians of 15. Build: gcc -O2 -mavx512f -mavx512bw -Iinclude -Iisa
 * -Iengine conv.c -Lbuild -ltilegrad */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "isa/ops.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static inline __m512i rne(__m512 v){ __m512i u=_mm512_castps_si512(v);
  __m512i lsb=_mm512_and_si512(_mm512_srli_epi32(u,16),_mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(u,_mm512_add_epi32(lsb,_mm512_set1_epi32(0x7fff))),16);}
/* rows r, r+1 of src -> Bp[p][j] = (bf16 src[2p][j], bf16 src[2p+1][j]) */
static void pair_split(int rows,int cols,const float*src,int lds,uint32_t*Bp,int ldb){
  for(int p=0;2*p<rows;p++) for(int c=0;c<cols;c+=16){
    __m512i a=rne(_mm512_loadu_ps(src+2*p*lds+c)), b=rne(_mm512_loadu_ps(src+(2*p+1)*lds+c));
    _mm512_storeu_si512(Bp+p*ldb+c,_mm512_or_si512(a,_mm512_slli_epi32(b,16)));}
}
typedef void (*fn)(void*);
static const tg_isa_ops*o; static float*S,*C; static uint16_t*H,*A; static uint32_t*B;
static int NQ,NK,DD;
static void f_row(void*x){o->f32_to_bf16_split(NQ,NK,S,NK,0,H,NULL,NULL,NK);}
static void f_tr(void*x){o->f32_to_bf16_split(NQ,NK,S,NK,1,H,NULL,NULL,NQ);}
static void f_tr2(void*x){o->f32_to_bf16_split(NQ,NK,S,NK,1,H,H+NQ*NK,NULL,NQ);}
static void f_tr3(void*x){o->f32_to_bf16_split(NQ,NK,S,NK,1,H,H+NQ*NK,H+2*NQ*NK,NQ);}
static void f_pair(void*x){pair_split(NQ,NK,S,NK,B,NK);}
static void f_s(void*x){o->bf16_dot_begin?o->bf16_dot_begin():(void)0; o->mm_bf16_pairs(NQ,NK,DD,A,DD,B,NK,C,NK,0); o->bf16_dot_end?o->bf16_dot_end():(void)0;}
static void f_dq(void*x){o->bf16_dot_begin?o->bf16_dot_begin():(void)0; o->mm_bf16_pairs(NQ,DD,NK,A,NK,B,DD,C,DD,1); o->bf16_dot_end?o->bf16_dot_end():(void)0;}
static double timeit(fn f){ double t[15]; for(int r=0;r<15;r++){ double t0=now(); for(int i=0;i<200;i++) f(0); t[r]=(now()-t0)/200*1e9;} qsort(t,15,8,cmp); return t[7]; }
int main(void){
  for(int ti=1;ti<=5;ti++){ o=tg_isa_table((tg_isa)ti); if(!o) continue;
    if(ti!=3&&ti!=5) continue;
    int shapes[][3]={{128,128,64},{64,64,64},{128,128,64}};
    for(int si=0;si<3;si++){ NQ=shapes[si][0]; NK=shapes[si][1]; DD=shapes[si][2];
      S=aligned_alloc(64,4*NQ*NK*4); C=aligned_alloc(64,4*512*512); H=aligned_alloc(64,2*3*NQ*NK+64); A=aligned_alloc(64,2*512*512); B=aligned_alloc(64,4*512*512);
      for(int i=0;i<NQ*NK;i++) S[i]=(float)((i*7919)%2001-1000)/997.0f;
      memset(A,0x3f,2*512*512); memset(B,0x3f,4*512*512); memset(C,0,4*512*512);
      timeit(f_tr3); timeit(f_row); /* warm-up */
      double r=timeit(f_row), tr=timeit(f_tr), tr2=timeit(f_tr2), tr3=timeit(f_tr3), pr=timeit(f_pair);
      printf("%-10s BQ %d BK %d: split row %.0f ns, transposed %.0f, 2 parts %.0f, 3 parts %.0f; pair interleave %.0f\n",
        o->name,NQ,NK,r,tr,tr2,tr3,pr);
      free(S);free(C);free(H);free(A);free(B);}
  }
  return 0; }
