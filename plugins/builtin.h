// The built-in models, datasets and epoch hooks, registered by name. Registration is an
// explicit call, not static initialisers, which a linker drops from static libraries.
#pragma once

namespace gpurun {
class Registry;
/// Adds every built-in below to `registry`.
void register_builtin_plugins(Registry& registry);
/// mlp, cnn (models.cpp), resnet (resnet.cpp), gpt (gpt.cpp), hf (llama.cpp).
void register_builtin_models(Registry& registry);

void register_resnet_model(Registry& registry);
void register_gpt_model(Registry& registry);
/// hf: Hugging Face's Llama family from a model folder (llama.cpp).
void register_hf_model(Registry& registry);
/// The epoch hook "sample": text generated after every epoch (sample_hook.cpp).
void register_sample_hook(Registry& registry);
}  // namespace gpurun
