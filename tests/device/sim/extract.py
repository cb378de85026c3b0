#!/usr/bin/env python3
"""Prints a CUDA kernel file of kernels/cuda as host C++ for tests/device/sim: the CUDA
includes dropped, the dynamic shared memory pointed at a host buffer, flash_attn.cu's
tensor-core primitives replaced by prims.h's emulation, and the launchers (<<<...>>>) cut,
sim.cpp launching the kernels itself. The markers it cuts at are named in the errors."""
import sys
src=open(sys.argv[1]).read()
kind=sys.argv[2]
def at(marker):
    i=src.find(marker)
    if i < 0:
        sys.exit("extract.py: %s no longer has the line %r (tests/device/sim cuts there)" % (sys.argv[1], marker))
    return i
for inc in ['#include <cuda_bf16.h>\n','#include <cuda_runtime.h>\n']:
    src=src.replace(inc,'')
src=src.replace('typedef __nv_bfloat16 bf16;\n','')
src=src.replace('extern __shared__ __align__(16) unsigned char smem_raw[];','unsigned char *smem_raw = g_smem;')
if kind=='fa':
    a=at('// ---- tensor-core primitives'); b=at('struct Fwd {')
    src=src[:a]+'#include "prims.h"\n\n'+src[b:]
    c=at('template <int HD> cudaError_t launch(')
    src=src[:c]+'} // namespace\n'
else:
    c=at('template <int G> cudaError_t launch_g(')
    src=src[:c]+'} // namespace\n'
sys.stdout.write(src)
