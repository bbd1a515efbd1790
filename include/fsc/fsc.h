/* fsc: FairScale for C. The umbrella header: everything a training program needs.
 *
 * It includes every entry-point header of include/fsc/, so one
 * `#include "fsc/fsc.h"` reaches the whole public API. Two headers are
 * details of another one and are reached through it, not listed here
 * (tests/repo/check_umbrella_header.py reads the line below and fails when a
 * header of include/fsc/ is neither included nor named there):
 *
 * excluded: fsc/export.h fsc/env.h
 *
 *   fsc/export.h  the FSC_API macro only; every public header includes it.
 *   fsc/env.h     part of floor 1 (core); fsc/core.h includes it.
 */
#ifndef FSC_H
#define FSC_H

#include "fsc/adascale.h"
#include "fsc/checkpoint.h"
#include "fsc/checkpoint_wrapper.h"
#include "fsc/core.h"
#include "fsc/cp.h"
#include "fsc/dist.h"
#include "fsc/flat_shards.h"
#include "fsc/fsdp.h"
#include "fsc/gpt.h"
#include "fsc/grad_scaler.h"
#include "fsc/io.h"
#include "fsc/kernels.h"
#include "fsc/layout.h"
#include "fsc/lora.h"
#include "fsc/moe.h"
#include "fsc/moe_parallel.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "fsc/parallel.h"
#include "fsc/pipe.h"
#include "fsc/pipe_schedule.h"
#include "fsc/profile.h"
#include "fsc/sharded_grad_scaler.h"
#include "fsc/strategy.h"
#include "fsc/tokenizer.h"
#include "fsc/tp.h"
#include "fsc/trainer.h"
#include "fsc/version.h"
#include "fsc/weights.h"
#include "fsc/zero.h"

#endif
