/* Fused projections: one matrix where a layer had three (wq, wk, wv) or two (w_gate, w_up),
 * so that the forward pass makes one product, one launch on a GPU, where it made three or
 * two (runtime/exec/forward.c; the op qkv_rope splits the q/k/v rows again, swiglu_fused
 * reads the gate/up rows).
 *
 * tsr_model_fuse fills each layer's wqkv (wq's rows, then wk's, then wv's), bqkv (the
 * q/k/v biases of Qwen2 and GPT-OSS, in the same order) and w_gate_up (w_gate's rows, then
 * w_up's) in model-owned memory, for F32, BF16, F16 and Q8_0 weights. A row's values and
 * its products are those of the row in its own matrix: the CPU kernels' summation order
 * does not depend on a row's place (kernels/cpu/gemm_cpu.c), so fused and unfused give the
 * same bits there. The parts then become views of the fused rows and their old storage is
 * dropped (tsr_model_discard; a file mapping goes with tsr_model_pack), so the weights are
 * held once. Q8_0 keeps its 16-row groups whole: when every part but the last is a whole
 * number of groups the fused bytes are the parts' bytes back to back and the parts stay
 * views; otherwise the rows are repacked into the fused groups (lossless) and the parts
 * keep their own storage.
 *
 * Not fused: a layer whose parts differ in dtype or width, other stages' (empty) layers,
 * and the mixture-of-experts projections (GPT-OSS's experts: one tensor already). Call
 * after the shard cut (a rank fuses its own rows: tsr_parallel_shard_model drops fused
 * tensors) and after conversion or quantization, before tsr_model_pack. A second call
 * changes nothing. */
#ifndef TSR_RUNTIME_MODEL_FUSE_H
#define TSR_RUNTIME_MODEL_FUSE_H

#include "base/status.h"
#include "runtime/model/model.h"

tsr_status tsr_model_fuse(tsr_model *m);

/* Layers with a fused wqkv / w_gate_up (benchmarks, tests). */
void tsr_model_fused_count(const tsr_model *m, int *qkv, int *gate_up);

#endif
