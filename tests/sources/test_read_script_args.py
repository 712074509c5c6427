"""A training script run with positional arguments (Pai-Megatron-Patch's examples): read with
them, from a launching file or from the command line.

tests/data/launch/pai/run_mcore_deepseek.sh: alibaba/Pai-Megatron-Patch @ a098ca5,
examples/deepseek_v2/run_mcore_deepseek.sh, verbatim; launch.sh: the launch of that directory's
README.md (lines 139-167), verbatim."""

from __future__ import annotations

import shlex
from pathlib import Path

from recompute_kit.sources.resolve import resolve

PAI = Path(__file__).resolve().parents[1] / "data" / "launch" / "pai"


def _args_of_readme_launch() -> list[str]:
    text = (PAI / "launch.sh").read_text().replace("\\\n", " ")
    line = next(x for x in text.splitlines() if x.strip().startswith("sh "))
    return shlex.split(line)[2:]


def test_a_launching_file_passes_its_arguments_and_exports():
    # A skill trial: the launch line could not be read at all, and the script alone left TP,
    # PP, the sequence and the precision to 19 undecided `if`s.
    reading = resolve([str(PAI / "launch.sh")]).reading
    assert reading.get("seq_length") == 1024  # $7
    assert reading.get("micro_batch_size") == 1  # $3
    assert reading.get("pipeline_model_parallel_size") == 4  # $11
    assert reading.get("expert_model_parallel_size") == 2  # $13
    assert reading.get("bf16") is True  # $9 bf16 decides the precision branch
    assert reading.get("recompute_granularity") == "selective"  # $18 sel
    # `export MP_PP0_LAYERS=6` before the call reaches the script
    assert reading.get("num_layers_in_first_pipeline_stage") == 6
    said = " ".join(reading.warnings)
    assert "26 positional arguments" in said and "MP_PP0_LAYERS=6" in said
    # an environment knob the script tests with `[ -z ${X} ]` is taken as unset, and said
    assert "MP_AC_LAYERS is not set by the script: taken as unset" in said
    assert "positional arguments" in reading.origins["seq_length"].note
    # `${offload_option}`, set only under `if [ $OPTIMIZER_OFFLOAD != false ]` (false here),
    # is empty, not a value the flag before it was "given"
    assert not any("is given $offload_option" in w for w in reading.warnings)


def test_the_script_with_its_arguments_as_one_input():
    args = _args_of_readme_launch()
    args[17] = "full"  # AC: full recompute, MP_AC_LAYERS layers (1 when unset)
    item = shlex.join([str(PAI / "run_mcore_deepseek.sh"), *args])
    reading = resolve([item]).reading
    assert reading.get("recompute_granularity") == "full"
    assert reading.get("recompute_method") == "uniform"
    assert reading.get("recompute_num_layers") == 1
    # `echo ${run_cmd}` prints the command; only `eval ${run_cmd}` runs it
    assert not any("training commands" in w for w in reading.warnings)
    # as the shell runs it (a skill trial's `bash train.sh A B` was taken for a model id)
    bashed = resolve([f"bash {item}"]).reading
    assert bashed.get("recompute_granularity") == "full"


def test_the_script_alone_says_what_its_undecided_branches_and_unset_values_leave_assumed():
    # Without its arguments the precision is decided by `if [ $PR = bf16 ]` on $9: Megatron-LM's
    # fp32 default was shown as a default (and the estimate ran in fp32) with no assumption
    # said; TP ($10) the same.
    from recompute_kit.sources.reading import FROM_ASSUMED

    reading = resolve([str(PAI / "run_mcore_deepseek.sh")], require_shape=False).reading
    bf16 = reading.origins["bf16"]
    assert reading.get("bf16") is False and bf16.kind == FROM_ASSUMED
    assert bf16.key == "--bf16" and "a branch the script does not decide" in bf16.note
    tp = reading.origins["tensor_model_parallel_size"]
    assert tp.kind == FROM_ASSUMED and "10th argument" in tp.note
    # given its arguments, they are read from the file
    assert resolve([str(PAI / "launch.sh")]).reading.origins["bf16"].kind == "file"


def test_the_readme_launch_holds_two_micro_batches_a_stage(capsys, tmp_path):
    # The README's launch at micro-batch 2, sequence 4096, no recompute, on 8 GPUs (DP 2): 8 /
    # (2 x 2) = 2 micro-batches a step, so no stage holds more than 2 (the estimate said 4 on
    # stage 0 and `plan --levers` refused the run as "not a valid layout")
    from recompute_kit.cli import main

    args = _args_of_readme_launch()
    args[2], args[6], args[7], args[17] = "2", "4096", "4096", "none"
    launch = tmp_path / "launch.sh"
    script = shlex.join(["sh", str(PAI / "run_mcore_deepseek.sh"), *args])
    launch.write_text(f"export MP_PP0_LAYERS=6\n{script}\n")
    common = ["--config", str(launch), "--model", "deepseek-ai/DeepSeek-V2-Lite", "--dp", "2"]
    assert main(["plan", *common, "--gpu", "h100-80gb", "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert [s["micro_batches_in_flight"] for s in doc["stages"]] == [2, 2, 2, 1]
    assert main(["plan", *common, "--gpu", "h100-80gb", "--levers", "--json"]) == 0
