"""PyTorch twins of ringtrain's model zoo (mlp, cnn, resnet, vit, gpt) with the same
parameter names and order as ringtrain's ParamArena, so weights can be copied
across by position. Used by the gradient cross-check and the throughput bench."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, cin, h, w, classes):
        super().__init__()
        self.fc1 = nn.Linear(cin * h * w, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, classes)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self, cin, h, w, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * (h // 4) * (w // 4), 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class Shortcut(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = Shortcut(cin, cout, stride) if (stride != 1 or cin != cout) else None

    def forward(self, x):
        h = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(h + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet(nn.Module):
    def __init__(self, cin, classes, depth=20, width=16):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(cin, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        cin_ = width
        for s in range(3):
            blocks = []
            for b in range(n):
                cout = width << s
                blocks.append(BasicBlock(cin_, cout, 2 if (s > 0 and b == 0) else 1))
                cin_ = cout
            setattr(self, "layer%d" % (s + 1), nn.Sequential(*blocks))
        self.fc = nn.Linear(cin_, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class PatchEmbed(nn.Module):
    """Patches (F.unfold: features ordered channel, row, column) -> Linear, + position embedding."""

    def __init__(self, cin, h, w, patch, dim):
        super().__init__()
        self.patch = patch
        self.proj = nn.Linear(cin * patch * patch, dim)
        self.pos_embed = nn.Parameter(torch.zeros((h // patch) * (w // patch), dim))

    def forward(self, x):
        return self.proj(F.unfold(x, self.patch, stride=self.patch).transpose(1, 2)) + self.pos_embed


class Attention(nn.Module):
    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        n, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        if self.causal and hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: the fused kernel
            return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(n, t, d))
        s = q @ k.transpose(-2, -1) * hd ** -0.5
        if self.causal:  # token i sees tokens j <= i
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        a = torch.softmax(s, dim=-1)
        return self.proj((a @ v).transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_ratio, causal=False):
        super().__init__()
        hidden = int(dim * mlp_ratio + 0.5)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, cin, h, w, classes, depth, width, heads, mlp_ratio, patch):
        super().__init__()
        self.patch_embed = PatchEmbed(cin, h, w, patch, width)
        self.blocks = nn.ModuleList([Block(width, heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.patch_embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x).mean(1))


class TokenEmbed(nn.Module):
    """Token + learned position embedding; ids arrive as floats [N, T] (ringtrain's batch)."""

    def __init__(self, vocab, seq_len, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab, dim))
        self.pos_embed = nn.Parameter(torch.zeros(seq_len, dim))

    def forward(self, x):
        return F.embedding(x.long(), self.weight) + self.pos_embed[: x.shape[1]]


class GPT(nn.Module):
    """wte -> causal pre-norm blocks -> LayerNorm -> logits x wte.weight^T (tied), [N, T, vocab]."""

    def __init__(self, vocab, seq_len, depth, width, heads, mlp_ratio):
        super().__init__()
        self.wte = TokenEmbed(vocab, seq_len, width)
        self.blocks = nn.ModuleList([Block(width, heads, mlp_ratio, causal=True) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        h = self.wte(x)
        for b in self.blocks:
            h = b(h)
        return self.norm(h) @ self.wte.weight.t()


def build(name, cin, h, w, classes, depth=20, width=16, heads=4, mlp_ratio=4.0, patch=4, seq_len=0):
    if name == "gpt":
        return GPT(classes, seq_len, depth, width, heads, mlp_ratio)
    if name == "vit":
        return ViT(cin, h, w, classes, depth, width, heads, mlp_ratio, patch)
    if name == "mlp":
        return MLP(cin, h, w, classes)
    if name == "cnn":
        return CNN(cin, h, w, classes)
    if name == "resnet":
        return ResNet(cin, classes, depth, width)
    raise SystemExit("unknown model %r" % name)
