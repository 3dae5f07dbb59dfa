"""The published networks that throughput tables need, at their papers' sizes, in plain
torch.nn (no torchvision): ResNet-50, VGG-11 and VGG-19, OverFeat's fast model, the 7-layer
DNN of Das et al. 2016 (a stand-in: its sizes were not found) and the Sockeye RNN model in
the configuration P3's artifact ran (rebuilt from Sockeye's source; no published count).
Each docstring gives the source, the published parameter count and what was not verified;
tests/unit/test_paper_models.py counts them. Imported only when a model is built."""

from __future__ import annotations

import torch
from torch import nn

from stalebench.models.nets import mlp

# --------------------------------------------------------------------------- ResNet-50


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(c_out)]


class Bottleneck(nn.Module):
    """1×1 (reduce) → 3×3 → 1×1 (×4), BatchNorm after each; a projection shortcut (1×1 conv
    and BatchNorm, He et al.'s option B) where the shape changes. The stride is on the 3×3
    (the "v1.5" placement; the paper's v1 puts it on the first 1×1: same parameters)."""

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            *conv_bn(c_in, width, 1), nn.ReLU(),
            *conv_bn(width, width, 3, stride), nn.ReLU(),
            *conv_bn(width, out, 1),
        )  # fmt: skip
        self.shortcut = (
            nn.Sequential(*conv_bn(c_in, out, 1, stride))
            if stride != 1 or c_in != out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    """ResNet-50 (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, Table
    1): a 7×7/2 conv and 3×3/2 max pool, bottleneck stages of [3, 4, 6, 3] blocks (64, 128,
    256, 512 wide, ×4 out), global average pooling, one linear layer. Stride on the 3×3
    (v1.5, as torchvision's). 25,557,032 parameters at 1,000 classes, torchvision's
    resnet50 count (the paper's Table 1 gives FLOPs, not parameters, from memory; "25.5M"
    is the usual rounding). No bias on the convolutions; BatchNorm's weight and bias are
    parameters."""

    def __init__(self, in_channels: int = 3, num_classes: int = 1000, blocks=(3, 4, 6, 3)):
        super().__init__()
        layers: list[nn.Module] = [*conv_bn(in_channels, 64, 7, 2), nn.ReLU()]
        layers.append(nn.MaxPool2d(3, 2, 1))
        c = 64
        for stage, n in enumerate(blocks):
            width = 64 * 2**stage
            for i in range(n):
                layers.append(Bottleneck(c, width, 2 if stage > 0 and i == 0 else 1))
                c = 4 * width
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# --------------------------------------------------------------------------- VGG

# Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale Image
# Recognition", ICLR 2015, Table 1: 3×3 convolutions (channels) and 2×2 max pools ("M")
VGG_LAYERS = {
    "A": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "E": [64, 64, "M", 128, 128, "M", *[256] * 4, "M", *[512] * 4, "M", *[512] * 4, "M"],
}


class VGG(nn.Module):
    """VGG without batch norm: configuration "A" (VGG-11, 132,863,336 parameters at 1,000
    classes; the paper's Table 2: 133 million) or "E" (VGG-19, 143,667,240; Table 2: 144
    million). Counts exact as torchvision's vgg11 / vgg19. 224×224 inputs end in 7×7×512
    maps; an adaptive average pool to 7×7 (parameter-free, the identity at 224) lets other
    sizes through. FC 4096-4096-classes, dropout 0.5 after the first two (paper §3.1)."""

    def __init__(self, config: str, in_channels: int = 3, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for v in VGG_LAYERS[config]:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU()]
                c = v
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(7), nn.Flatten(), *fc_stack(c * 49, [4096, 4096], num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def fc_stack(width: int, hidden: list[int], num_classes: int) -> list[nn.Module]:
    """Linear + ReLU + dropout 0.5 per hidden width, then the output layer."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(0.5)]
        width = h
    return [*layers, nn.Linear(width, num_classes)]


# --------------------------------------------------------------------------- OverFeat


def overfeat_map(size: int) -> int:
    """The side of OverFeat-fast's last feature map for an input side `size` (231 → 6):
    11×11/4 conv, 2×2 pool, 5×5 conv, 2×2 pool, three padded 3×3 convs, 2×2 pool."""
    return (((size - 11) // 4 + 1) // 2 - 4) // 2 // 2


class OverFeatFast(nn.Module):
    """OverFeat's fast model (Sermanet et al., "OverFeat: Integrated Recognition,
    Localization and Detection using Convolutional Networks", ICLR 2014, Table 1): 231×231
    inputs; conv 96 11×11/4 + max pool 2; conv 256 5×5 + max pool 2; conv 512, 1024, 1024
    3×3 (zero padding 1) + max pool 2 after the last; FC 3072, 4096, classes (dropout 0.5
    on the first two). The last map is 6×6×1024 at 231 (the FC input is whatever the input
    size gives). 145,920,872 parameters at 1,000 classes, counted here; the paper's own
    count (about 145 million, from memory) is UNVERIFIED: search found neither the paper's
    text nor its table of parameters. The layer table matches two third-party definitions
    found by search (NNPACK's benchmark layers: fc6 36,864 → 3,072; a Torch OverFeat-fast
    definition reshaping to 6×6), not the paper itself."""

    def __init__(self, in_channels: int = 3, num_classes: int = 1000, image=(231, 231)):
        super().__init__()
        h, w = (overfeat_map(s) for s in image)
        if h < 1 or w < 1:
            raise ValueError(f"OverFeat-fast needs larger images than {image}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 96, 11, stride=4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(96, 256, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(256, 512, 3, padding=1), nn.ReLU(),
            nn.Conv2d(512, 1024, 3, padding=1), nn.ReLU(),
            nn.Conv2d(1024, 1024, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Flatten(), *fc_stack(1024 * h * w, [3072, 4096], num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# --------------------------------------------------------------------------- Das et al.'s DNN


def das_dnn(input_shape: tuple[int, ...], num_classes: int, width: int, layers: int) -> nn.Module:
    """The "7-layer DNN" of Das et al., "Distributed Deep Learning Using Synchronous
    Stochastic Gradient Descent", arXiv 1602.06709 (2016), scaled 6.5× on 16 nodes (its
    abstract): a fully connected speech-recognition (ASR) network. A STAND-IN: only "7-layer"
    and "DNN" are verified (the abstract); the paper's input size, hidden width, output
    size and activation could not be found by search. Here: `layers` weight layers
    (7: six hidden ReLU layers of `width`, 2048 by default, and the output), the input
    flattened. At the stand-in shape of 440 inputs (11 frames of 40 filterbank features,
    a common hybrid-ASR input) and 9,000 output states, both ours, it has 40,325,928
    parameters; no published count to compare."""
    return mlp(input_shape, num_classes, hidden=[width] * (layers - 1))


# --------------------------------------------------------------------------- Sockeye (P3)

# P3's Sockeye run (anandj91/p3, example/sockeye/scripts/sockeye_1.5-iwslt15_en-vi.sh; the
# ctuning reproduction's ck_run_sockeye.sh has the same flags): Sockeye 1.5, --encoder rnn
# --decoder rnn --num-layers 2:2 --rnn-cell-type lstm --rnn-num-hidden 512 --num-embed
# 512:512 --attention-type mlp --attention-num-hidden 512 --rnn-encoder-reverse-input, on
# IWSLT15 English-Vietnamese with the repository's vocab.en (17,188 words) and vocab.vi
# (7,706), to which Sockeye adds <pad>, <unk>, <s>, </s>
SOCKEYE_SOURCE_VOCAB, SOCKEYE_TARGET_VOCAB = 17_192, 7_710


class SockeyeRNN(nn.Module):
    """The RNN encoder-decoder with attention of Sockeye 1.5 (Hieber et al. 2017) in the
    configuration P3 (Jayarajan et al., "Priority-based Parameter Propagation for
    Distributed DNN Training", SysML/MLSys 2019) trained, rebuilt layer for layer from the
    Sockeye 1.5 source in P3's artifact repository (encoder.py, decoder.py, attention.py,
    rnn.py): source embedding; a bidirectional LSTM layer (hidden/2 each way) over the
    reversed source, then layers − 1 LSTM layers; decoder LSTM layers fed the previous
    target embedding and the previous attentional state (input feeding), initialised from
    the encoder's last state by one tanh linear layer per layer state (h and c); MLP
    attention (no biases); the attentional state tanh(W [output; context] + b); the output
    layer. 27,734,558 parameters at P3's vocabularies (17,192 source, 7,710 target), counted
    here from that configuration: the P3 paper's own size for Sockeye was not found. Sockeye
    and torch LSTMs both carry two bias vectors.

    In stalebench a batch is one (B, T) tensor of token ids (one vocabulary): it is both
    the source and the decoder's teacher-forced input (`target` may be given apart), and
    the output is logits (B, T, target vocabulary). On a next-token dataset the encoder sees
    the tokens to predict, so use the model for throughput and message sizes, not for
    accuracy claims."""

    def __init__(
        self,
        source_vocab: int = SOCKEYE_SOURCE_VOCAB,
        target_vocab: int = SOCKEYE_TARGET_VOCAB,
        embed: int = 512,
        hidden: int = 512,
        layers: int = 2,
        attention: int = 512,
    ):
        super().__init__()
        self.source_embed = nn.Embedding(source_vocab, embed)
        self.birnn = nn.LSTM(embed, hidden // 2, batch_first=True, bidirectional=True)
        self.encoder = nn.LSTM(hidden, hidden, layers - 1, batch_first=True) if layers > 1 else None
        self.target_embed = nn.Embedding(target_vocab, embed)
        sizes = [embed + hidden] + [hidden] * (layers - 1)
        self.decoder = nn.ModuleList(nn.LSTMCell(n, hidden) for n in sizes)
        self.init = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(2 * layers))
        self.att_source = nn.Linear(hidden, attention, bias=False)
        self.att_query = nn.Linear(hidden, attention, bias=False)
        self.att_score = nn.Linear(attention, 1, bias=False)
        self.combine = nn.Linear(2 * hidden, hidden)
        self.out = nn.Linear(hidden, target_vocab)

    def forward(self, source: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        target = source if target is None else target
        enc, _ = self.birnn(self.source_embed(source.flip(1)))
        if self.encoder is not None:
            enc, _ = self.encoder(enc)
        last = enc[:, -1]
        it = iter(self.init)
        states = [(torch.tanh(next(it)(last)), torch.tanh(next(it)(last))) for _ in self.decoder]
        keys = self.att_source(enc)  # (B, S, attention)
        state = enc.new_zeros(enc.shape[0], enc.shape[2])
        embedded, outputs = self.target_embed(target), []
        for t in range(target.shape[1]):
            x = torch.cat([embedded[:, t], state], 1)
            for i, cell in enumerate(self.decoder):
                states[i] = cell(x, states[i])
                x = states[i][0]
            scores = self.att_score(torch.tanh(keys + self.att_query(x)[:, None])).squeeze(2)
            context = (scores.softmax(1)[:, :, None] * enc).sum(1)
            state = torch.tanh(self.combine(torch.cat([x, context], 1)))
            outputs.append(state)
        return self.out(torch.stack(outputs, 1))
