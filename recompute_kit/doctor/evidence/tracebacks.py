"""Python tracebacks, exception lines and warnings: what they look like. The log parser's state
machine (logs.py) reads them line by line; frames are kept as evidence (file:line in function).
"""

from __future__ import annotations

import re

from ...sources.text import _DOTTED
from .schema import ErrorEvent

_EXC_LINE_RE = re.compile(rf"^({_DOTTED})(?::\s?(.*))?$")
# Warnings libraries print without a "XWarning:" prefix (logger.warning_once in transformers,
# print() in PEFT recipes), recognised by their wording.
_BARE_WARNINGS = (
    "is incompatible with gradient checkpointing",
    "None of the inputs have requires_grad",
    "pass in use_reentrant",
    "use_reentrant parameter should be passed explicitly",
    "does not support gradient checkpointing",
    "memory is still in use",  # vLLM's sleep mode: what it could not release
    "old version of the checkpointing format",  # transformers, remote-code models
)
# Error messages people paste without the exception line's "RuntimeError: " head; each is a
# message PyTorch, DDP or DeepSpeed raises (the rules quote the sources).
_BARE_ERRORS = (
    "does not require grad and does not have a grad_fn",
    "Trying to backward through the graph a second time",
    "has already been reduced",
    "Expected to mark a variable ready only once",
    "have different metadata than during the forward pass",
    "Unpack is being triggered for a tensor that was already unpacked once",
    "Recomputed values for the following tensors",  # torch.utils.checkpoint.CheckpointError
    "save_for_backward can only save variables",  # torch.autograd.Function's TypeError
    "error: unrecognized arguments:",  # argparse, the script's name before it
    "--checkpoint-activations is no longer valid",  # Megatron-LM's exit for the old flag
)
_BARE_ERRORS_RE = re.compile("|".join(re.escape(p) for p in _BARE_ERRORS))
_WARN_RE = re.compile(rf"^(?:(\S.*?):(\d+): )?({_DOTTED}Warning): (.*)$")
_MEGATRON_WARN_RE = re.compile(r"^WARNING:(?:[\w.]+:)?\s?(.*)$")
_FRAME_RE = re.compile(r'^\s*File "(.+?)", line (\d+)(?:, in (.*))?$')
_CHAIN_CAUSE = "The above exception was the direct cause of the following exception"
_CHAIN_CONTEXT = "During handling of the above exception, another exception occurred"
_MAX_FRAMES = 200
_MAX_DETAIL_LINES = 30


class _Traceback:
    """One rank's traceback or exception message being read."""

    __slots__ = (
        "chained", "details", "event", "frame_indent", "frames", "source", "source_due", "state",
    )

    def __init__(self, chained: str = "") -> None:
        self.frames: list[str] = []
        self.frame_indent = 0  # the last frame line's indentation (a pasted block shifts it)
        self.source_due = False  # a frame was read: its source line may follow (unindented
        # when the paste lost its whitespace)
        self.source = ""  # the last frame's source line ("assert args.x, ..." names the type)
        self.state = "frames"  # frames -> message (after the exception line)
        self.event: ErrorEvent | None = None
        self.details: list[str] = []
        self.chained = chained
