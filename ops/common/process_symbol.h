// A function of a CUDA library that libtorch_cuda has already loaded (cuBLAS,
// cuBLASLt), found in the process rather than linked: the library links none
// of them itself, so that a process never holds two builds of one under one
// soname (the toolkit's and the one PyTorch ships).
#pragma once

#include <dlfcn.h>

#define CUSTOMCONV_SYMBOL_STR2(x) #x
#define CUSTOMCONV_SYMBOL_STR(x) CUSTOMCONV_SYMBOL_STR2(x)

namespace customconv {

// `name` in the process's global scope, else in `soname` if it is loaded
// (perhaps outside the global scope); null where neither has it.
inline void* process_symbol(const char* name, const char* soname) {
  void* sym = dlsym(RTLD_DEFAULT, name);
  if (sym == nullptr) {
    if (void* lib = dlopen(soname, RTLD_NOW | RTLD_NOLOAD)) sym = dlsym(lib, name);
  }
  return sym;
}

}  // namespace customconv
