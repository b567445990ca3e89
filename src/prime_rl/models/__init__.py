"""What the trainer and the inference server agree on about a model: the tiny and embedded models, the vocabulary a
sampler draws from, the sampling rule, the output head, the LoRA adapter directory."""
