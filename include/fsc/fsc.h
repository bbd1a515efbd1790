/* fsc: FairScale for C. The umbrella header: everything a training program needs. */
#ifndef FSC_H
#define FSC_H

#include "fsc/checkpoint.h"
#include "fsc/checkpoint_wrapper.h"
#include "fsc/core.h"
#include "fsc/dist.h"
#include "fsc/flat_shards.h"
#include "fsc/fsdp.h"
#include "fsc/gpt.h"
#include "fsc/grad_scaler.h"
#include "fsc/io.h"
#include "fsc/kernels.h"
#include "fsc/moe.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "fsc/parallel.h"
#include "fsc/pipe_schedule.h"
#include "fsc/sharded_grad_scaler.h"
#include "fsc/tokenizer.h"
#include "fsc/tp.h"
#include "fsc/version.h"
#include "fsc/weights.h"
#include "fsc/zero.h"

#endif
