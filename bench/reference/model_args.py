"""Command-line options naming a model the way ringtrain's ModelConfig does,
shared by the PyTorch reference scripts (no torch import, so a script can
report a missing torch as JSON)."""


def add_model_args(ap, model="cnn"):
    ap.add_argument("--model", default=model)
    ap.add_argument("--in-channels", type=int, default=1)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--mlp-ratio", type=float, default=4.0)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=0, help="gpt: tokens per sample (--classes is the vocabulary)")


def build_model(torch_models, a):
    return torch_models.build(a.model, a.in_channels, a.size, a.size, a.classes, a.depth, a.width, a.heads,
                              a.mlp_ratio, a.patch, seq_len=a.seq_len)
