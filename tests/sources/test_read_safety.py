"""Reading never runs the user's code: hostile recipes, scripts, YAML tags and model configs
are read as text (or refused in one line), and nothing they ask for happens."""

from __future__ import annotations

from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.sources.resolve import resolve


def hostile_files(marker: Path) -> dict[str, str]:
    touch = f"touch {marker}"
    return {
        "recipe.py": (
            "import os\n"
            f"os.system({touch!r})\n"
            f"__import__('os').system({touch!r})\n"
            "def pretrain_config(tensor_parallelism: int = 2):\n"
            f"    exec({touch!r})\n"
            "    cfg.model.num_layers = 4\n"
        ),
        "launch.sh": (
            "#!/bin/bash\n"
            f"TP=$({touch})\n"
            f"PP=`{touch}`\n"
            f"eval \"{touch}\"\n"
            f"source <({touch})\n"
            "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 64 \\\n"
            "    --num-attention-heads 4 --tensor-model-parallel-size $TP\n"
        ),
        "tags.yaml": (
            f"model: !!python/object/apply:os.system [{touch!r}]\n"
            f"num_layers: !!python/object/apply:subprocess.call [[touch, {str(marker)!r}]]\n"
        ),
        "nemo.yaml": (
            "trainer:\n  devices: 8\nmodel:\n  num_layers: 4\n  hidden_size: 64\n"
            "  num_attention_heads: 4\n  encoder_seq_length: ${oc.env:HOME}\n"
            f"  micro_batch_size: ${{eval:'__import__(\"os\").system(\"{touch}\")'}}\n"
        ),
        "config.json": (
            '{"model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig"}, '
            '"architectures": ["EvilForCausalLM"], "num_hidden_layers": 4, '
            '"hidden_size": 64, "num_attention_heads": 4}'
        ),
        "train.toml": (
            '[model]\nname = "llama3"\nflavor = "debugmodel"\n'
            f'[job]\ndump_folder = "$({touch})"\n'
        ),
    }


@pytest.mark.parametrize("name", list(hostile_files(Path("x"))))
def test_nothing_runs(tmp_path, name):
    marker = tmp_path / "PWNED"
    path = tmp_path / name
    path.write_text(hostile_files(marker)[name])
    try:
        resolve([str(path)], require_shape=False)
    except ConfigError as exc:
        assert "\n" not in str(exc)
    assert not marker.exists(), f"{name} ran code while being read"
