"""The one reader of what users train with.

Megatron-LM launch scripts and argument YAMLs, Megatron-Bridge YAMLs, printed ConfigContainers,
Hydra overrides and recipes, NeMo 1.x / Launcher and NeMo-RL YAMLs, torchtitan TOMLs, Hugging
Face `config.json`s and model ids, HF Trainer / LLaMA-Factory / TRL YAMLs and DeepSpeed JSONs
become one `Config`, and every value keeps where it came from (`Origin`): the file and key, the
framework's default, the model's public config, a derivation, or an assumption said aloud.

Every command and notebook reads through `read_inputs`; nothing else parses configs.
"""

from .reading import EXTRA_KEYS, KNOWN_KEYS, MEMORY_KEYS, Origin, Reading

__all__ = ["EXTRA_KEYS", "KNOWN_KEYS", "MEMORY_KEYS", "Origin", "Reading"]
