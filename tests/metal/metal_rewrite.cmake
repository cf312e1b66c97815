# metal_rewrite.cmake -- the shim's only source rewrite (cmake -P, no other
# tools). Four MSL forms that macros cannot reach are rewritten in place,
# keeping line numbers:
#   [[threadgroup(n)]]                         -> [[mtl_threadgroup_arg(n)]]
#   threadgroup T name[N]...;   (kernel body)   -> MTL_TG_LOCAL(name, [N]..., T);
#     (not a pointer or reference declaration: `threadgroup T *p = ...;` is an
#     ordinary thread variable and keeps its meaning with `threadgroup` erased)
#   constant T name [[function_constant(i)]];  -> MTL_FUNCTION_CONSTANT(name, i, T);
#   constant T name = ...is_function_constant_defined...;  (one line, program scope)
#                                               -> MTL_DERIVED_CONSTANT(name, T, ...);
#     (a constant computed from function constants, e.g. an optional one's
#     default: evaluated at every use, in the running dispatch)
# Usage: cmake -DIN=file.metal -DOUT=file.metal.cc -P metal_rewrite.cmake
file(READ "${IN}" src)
string(REGEX REPLACE "\\[\\[([ \t]*)threadgroup[ \t]*\\(" "[[\\1mtl_threadgroup_arg(" src "${src}")
string(REGEX REPLACE
  "\n([ \t]*)threadgroup[ \t]+([^;(),=*&\n]+)[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*((\\[[^]\n]*\\][ \t]*)*);"
  "\n\\1MTL_TG_LOCAL(\\3, \\4, \\2);" src "${src}")
string(REGEX REPLACE
  "\n([ \t]*)constant[ \t]+([^;\n]+)[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\\[\\[[ \t]*function_constant[ \t]*\\(([^)]*)\\)[ \t]*\\]\\][ \t]*;"
  "\n\\1MTL_FUNCTION_CONSTANT(\\3, \\4, \\2);" src "${src}")
string(REGEX REPLACE
  "\n([ \t]*)constant[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*=([^;\n]*is_function_constant_defined[^;\n]*);"
  "\n\\1MTL_DERIVED_CONSTANT(\\3, \\2,\\4);" src "${src}")
file(WRITE "${OUT}" "#line 1 \"${IN}\"\n${src}")
