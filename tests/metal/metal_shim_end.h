/* metal_shim_end.h -- removes the MSL keyword macros of metal_shim_keywords.h
 * so host code after the included .metal files sees plain C++ again. */
#undef kernel
#undef device
#undef constant
#undef thread
#undef threadgroup
#undef METAL_FUNC
#undef buffer
#undef mtl_threadgroup_arg
#undef thread_position_in_grid
#undef thread_position_in_threadgroup
#undef threadgroup_position_in_grid
#undef threads_per_threadgroup
#undef threadgroups_per_grid
#undef threads_per_grid
#undef thread_index_in_threadgroup
#undef thread_index_in_simdgroup
#undef simdgroup_index_in_threadgroup
#undef threads_per_simdgroup
#undef simdgroups_per_threadgroup
#undef function_constant
#undef host_name
#undef max_total_threads_per_threadgroup
#undef is_function_constant_defined
