/* fsc: FairScale for C. The umbrella header: everything a training program needs. */
#ifndef FSC_H
#define FSC_H

#include "fsc/core.h"
#include "fsc/gpt.h"
#include "fsc/io.h"
#include "fsc/kernels.h"
#include "fsc/nn.h"
#include "fsc/optim.h"
#include "fsc/weights.h"

#define FSC_VERSION_MAJOR 0
#define FSC_VERSION_MINOR 1

#endif
