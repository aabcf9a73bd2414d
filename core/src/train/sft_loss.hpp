// grove sft's loss on one batch, shared by run_sft and the test that compares it with TRL's
// SFTTrainer.compute_loss. Internal to core/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "grove/sft.hpp"

namespace grove {

class Model;

struct SftLoss {
    at::Tensor loss;                 // differentiable: the cross-entropy plus the weighted load-balancing term
    std::optional<double> aux_loss;  // a mixture of experts' load-balancing loss (unweighted), when it is trained
};

// Next-token cross-entropy over the trained tokens of the examples `picked`, their rows packed end to
// end; a mixture of experts with router_aux_loss_coef != 0 adds coef x its load-balancing loss, as
// TRL 1.16's SFTTrainer does (one micro-batch per optimizer step).
SftLoss sft_loss(Model& model, const std::vector<SftExample>& examples, const std::vector<int64_t>& picked,
                 double router_aux_loss_coef);

}  // namespace grove
