/*
 * metal_shim_keywords.h -- the MSL keywords and [[attributes]] as macros.
 * Pulled in by the stub <metal_stdlib> (tests/metal/include/) at the top of
 * every .metal file; metal_shim_end.h removes them again. No include guard:
 * re-defining identical macros is allowed, and a second .metal file in the
 * same translation unit needs them back after metal_shim_end.h.
 *
 * Address spaces vanish (host memory is one space). Every kernel-parameter
 * attribute becomes a default argument:
 *
 *     const device float *x [[buffer(3)]]
 *  -> const float *x [[maybe_unused]] = ::mtl_sim::BufArg{3}[::mtl_sim::zero[0]]
 *
 * (the macro closes the attribute, opens the default argument, and the
 * source's own `]]` closes two subscripts). Calling the kernel by name with
 * no arguments then binds every parameter from the simulated thread's
 * context. Attribute lists must name the binding first:
 * [[buffer(11), function_constant(has_mask)]].
 *
 * Two MSL forms cannot be reached by macros and are rewritten, line by line,
 * by metal_rewrite.cmake before compiling (documented in metal/README.md):
 *   `threadgroup T name[N];` in a kernel body -> MTL_TG_LOCAL(name, [N], T);
 *   `constant T name [[function_constant(i)]];` -> MTL_FUNCTION_CONSTANT(name, i, T);
 *   `constant T name = <uses is_function_constant_defined>;` -> MTL_DERIVED_CONSTANT(name, T, ...);
 *   `[[threadgroup(n)]]` -> [[mtl_threadgroup_arg(n)]]
 */
#define kernel
#define device
#define constant
#define thread
#define threadgroup
#define METAL_FUNC inline

#define MTL_SIM_ATTR_ARG(expr) maybe_unused]] = expr[::mtl_sim::zero[0
#define buffer(n) MTL_SIM_ATTR_ARG(::mtl_sim::BufArg{n})
#define mtl_threadgroup_arg(n) MTL_SIM_ATTR_ARG(::mtl_sim::TgArg{n})
#define thread_position_in_grid MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_TPIG})
#define thread_position_in_threadgroup MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_TPITG})
#define threadgroup_position_in_grid MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_TGPIG})
#define threads_per_threadgroup MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_TPTG})
#define threadgroups_per_grid MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_TGPG})
#define threads_per_grid MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_TPG})
#define thread_index_in_threadgroup MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_TIITG})
#define thread_index_in_simdgroup MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_TIISG})
#define simdgroup_index_in_threadgroup MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_SGIITG})
#define threads_per_simdgroup MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_TPSG})
#define simdgroups_per_threadgroup MTL_SIM_ATTR_ARG(::mtl_sim::SysArg{::mtl_sim::SV_SGPTG})

#define function_constant(x) 0
#define host_name(x)
#define max_total_threads_per_threadgroup(x)
#define is_function_constant_defined(x) ((x).defined())

#define MTL_TG_LOCAL(name, ext, ...)                                                   \
  using name##_mtl_type = __VA_ARGS__ ext;                                             \
  static char name##_mtl_key;                                                          \
  name##_mtl_type &name = *static_cast<name##_mtl_type *>(                             \
      ::mtl_sim::tg_local(&name##_mtl_key, sizeof(name##_mtl_type), alignof(name##_mtl_type)))
#define MTL_FUNCTION_CONSTANT(name, idx, ...) \
  static const ::mtl_sim::FunctionConstant<__VA_ARGS__, idx> name {}
/* A program-scope constant computed from function constants: its initializer
 * runs at every use, so it sees the running dispatch's constants. */
#define MTL_DERIVED_CONSTANT(name, T, ...)                    \
  struct name##_mtl_derived {                                 \
    operator T() const { return (__VA_ARGS__); }              \
  };                                                          \
  static const name##_mtl_derived name {}
