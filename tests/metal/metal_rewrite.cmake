# metal_rewrite.cmake -- the shim's only source rewrite (cmake -P, no other
# tools). Three MSL forms that macros cannot reach are rewritten in place,
# keeping line numbers:
#   [[threadgroup(n)]]                         -> [[mtl_threadgroup_arg(n)]]
#   threadgroup T name[N]...;   (kernel body)   -> MTL_TG_LOCAL(name, [N]..., T);
#     (not a pointer or reference declaration: `threadgroup T *p = ...;` is an
#     ordinary thread variable and keeps its meaning with `threadgroup` erased)
#   constant T name [[function_constant(i)]];  -> MTL_FUNCTION_CONSTANT(name, i, T);
# Usage: cmake -DIN=file.metal -DOUT=file.metal.cc -P metal_rewrite.cmake
file(READ "${IN}" src)
string(REGEX REPLACE "\\[\\[([ \t]*)threadgroup[ \t]*\\(" "[[\\1mtl_threadgroup_arg(" src "${src}")
string(REGEX REPLACE
  "\n([ \t]*)threadgroup[ \t]+([^;(),=*&\n]+)[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*((\\[[^]\n]*\\][ \t]*)*);"
  "\n\\1MTL_TG_LOCAL(\\3, \\4, \\2);" src "${src}")
string(REGEX REPLACE
  "\n([ \t]*)constant[ \t]+([^;\n]+)[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\\[\\[[ \t]*function_constant[ \t]*\\(([^)]*)\\)[ \t]*\\]\\][ \t]*;"
  "\n\\1MTL_FUNCTION_CONSTANT(\\3, \\4, \\2);" src "${src}")
file(WRITE "${OUT}" "#line 1 \"${IN}\"\n${src}")
