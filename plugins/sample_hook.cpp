// The `sample` epoch hook: after every epoch, a model of token data writes sample.length
// characters from sample.prompt to the log, so that a language model's progress can be read.
//
// It applies when the dataset gives integer ids [time] with class_names (the text dataset)
// and the model gives logits [B, T, vocabulary] (gpt); otherwise it does nothing. Generation is
// autoregressive: the last data.context tokens are fed, and the next token is the arg-max of
// the last position's logits (sample.temperature 0) or drawn from softmax(logits / temperature)
// with a generator of its own, seeded with sample.seed. Registry::run_epoch_hooks runs it in eval
// mode without grad and restores the global RNG, so sampling never changes training.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "builtin.h"
#include "gpurun/model.h"
#include "gpurun/registry.h"
#include "util/utf8.h"

namespace gpurun {
namespace {

/// The prompt's token ids; characters outside the vocabulary are left out with a warning.
/// An empty prompt is the evaluation text's first (up to 16) characters.
std::vector<int64_t> prompt_tokens(const EpochEnd& e) {
  std::vector<int64_t> ids;
  const std::vector<std::string>& names = e.data.class_names;
  if (e.config.sample.prompt.empty()) {
    at::Tensor first =
        e.data.eval->get(at::zeros({1}, at::kLong)).inputs.reshape({-1}).to(at::kLong);
    const int64_t n = std::min<int64_t>(16, first.numel());
    for (int64_t i = 0; i < n; ++i) ids.push_back(first[i].item<int64_t>());
    return ids;
  }
  std::string missing;
  for (char32_t ch : utf8::decode(e.config.sample.prompt, "sample.prompt")) {
    const std::string text = utf8::encode(ch);
    const auto it = std::find(names.begin(), names.end(), text);
    if (it == names.end()) {
      missing += (missing.empty() ? "" : ", ") + utf8::describe(ch);
      continue;
    }
    ids.push_back(it - names.begin());
  }
  if (!missing.empty())
    spdlog::warn("sample.prompt: characters not in the data's vocabulary are left out: {}",
                 missing);
  if (ids.empty()) ids.push_back(0);
  return ids;
}

void sample_text(const EpochEnd& e) {
  const SampleConfig& c = e.config.sample;
  if (c.length == 0 || e.data.class_names.empty() || e.data.input_shape.size() != 1 ||
      e.data.eval->size() == 0)
    return;
  if (c10::isFloatingType(e.data.eval->get(at::zeros({1}, at::kLong)).inputs.scalar_type())) return;
  const auto start = std::chrono::steady_clock::now();
  const int64_t context = e.data.input_shape[0];
  const std::vector<int64_t> prompt = prompt_tokens(e);
  at::Tensor sequence = at::tensor(prompt, at::kLong).unsqueeze(0).to(e.device);  // [1, T]
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.seed));
  const int64_t vocabulary = static_cast<int64_t>(e.data.class_names.size());
  std::string text;
  for (int64_t id : prompt) text += e.data.class_names[id];
  text += "|";  // where the prompt ends
  for (int64_t i = 0; i < c.length; ++i) {
    const int64_t time = sequence.size(1);
    at::Tensor logits = e.model.forward(
        sequence.narrow(1, std::max<int64_t>(0, time - context), std::min(time, context)));
    if (logits.dim() != 3 || logits.size(-1) != vocabulary) {
      spdlog::debug("sample: the model gives logits {}, not [1, T, {}]; no sample",
                    c10::str(logits.sizes()), vocabulary);
      return;
    }
    at::Tensor last = logits.select(1, logits.size(1) - 1).to(at::kCPU).to(at::kFloat);  // [1, V]
    at::Tensor next = c.temperature > 0
                          ? at::multinomial(last.div(c.temperature).softmax(-1), 1, false, gen)
                          : last.argmax(-1, /*keepdim=*/true);
    text += e.data.class_names[next.item<int64_t>()];
    sequence = at::cat({sequence, next.to(e.device)}, 1);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char how[48] = "greedy";
  if (c.temperature > 0) std::snprintf(how, sizeof how, "temperature %g", c.temperature);
  spdlog::info("sample after epoch {} ({}, {:.1f} s; the prompt ends at |):\n{}", e.epoch + 1, how,
               seconds, text);
}

}  // namespace

void register_sample_hook(Registry& registry) { registry.add_epoch_hook("sample", sample_text); }

}  // namespace gpurun
