"""Model zoo: ConvNet (DM/FedDM/FedAF/DynaFed backbone) and the other client models.

Every model exposes the same three-part contract that later algorithms rely on
(MOON's representations, FedAF/FedDM distribution matching, DCFL's CKA on
classifier weights):

- ``model.embed(x)``: the flattened features, i.e. everything before the
  final linear layer, shape ``(batch, feature_dim)``;
- ``model.classifier``: that final ``nn.Linear``;
- ``model(x) == model.classifier(model.embed(x))``.

Build models through :func:`build_model`; it validates its arguments and raises
:class:`~raysim.errors.RaysimError` with a one-line message on bad input.
"""

from __future__ import annotations

import torch
from torch import nn

from raysim.errors import RaysimError

MODEL_NAMES: tuple[str, ...] = ("convnet", "mlp", "cnn2", "cnn3", "lenet", "resnet18", "googlenet")
NORMS: tuple[str, ...] = ("batchnorm", "instancenorm", "none")


class _Backbone(nn.Module):
    """Base class: subclasses set ``self.features`` (a module whose output is
    flattened) and ``self.classifier``."""

    features: nn.Module
    classifier: nn.Linear

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.features(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


def _flat_dim(features: nn.Module, in_channels: int, image_size: int) -> int:
    """Size of the flattened output of ``features`` for one input image.

    Runs a dummy forward in eval mode (so BatchNorm running statistics are not
    touched) and restores the previous training flag.
    """
    was_training = features.training
    features.eval()
    try:
        with torch.no_grad():
            out = features(torch.zeros(1, in_channels, image_size, image_size))
    except RuntimeError:  # e.g. a kernel larger than the shrunken feature map
        raise RaysimError(
            f"image_size {image_size} is too small for this model: "
            "use larger images or, for convnet, a smaller model.depth"
        ) from None
    finally:
        features.train(was_training)
    if out.numel() == 0:
        raise RaysimError(
            f"image_size {image_size} is too small for this model (empty feature map): "
            "use larger images or, for convnet, a smaller model.depth"
        )
    return out[0].numel()


def _norm_layer(norm: str, channels: int) -> nn.Module:
    if norm == "batchnorm":
        return nn.BatchNorm2d(channels)
    if norm == "instancenorm":
        # DM's code: GroupNorm with one group per channel == instance norm with
        # a per-channel affine, and independent of the batch (unlike BN).
        return nn.GroupNorm(channels, channels, affine=True)
    return nn.Identity()


class ConvNet(_Backbone):
    """DM-style ConvNet: ``depth`` x [conv3x3(width) -> norm -> ReLU -> avgpool2],
    then one linear classifier on the flattened features (2048-d at 28/32 px
    with width 128, depth 3)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int,
                 width: int = 128, depth: int = 3, norm: str = "batchnorm"):
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for i in range(depth):
            # As in DM's code: a 28-px input is padded to 32 px by the first conv
            # (padding 3 with a 3x3 kernel adds 4 px), giving the same 2048-d
            # embedding as CIFAR.
            padding = 3 if (i == 0 and image_size == 28) else 1
            layers += [
                nn.Conv2d(channels, width, kernel_size=3, padding=padding),
                _norm_layer(norm, width),
                nn.ReLU(inplace=True),
                nn.AvgPool2d(kernel_size=2, stride=2),
            ]
            channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(_flat_dim(self.features, in_channels, image_size), num_classes)


class MLP(_Backbone):
    """Flatten -> hidden -> ReLU -> hidden -> ReLU -> classifier
    (784-128-128-C for 28-px grey input, as in DynaFed)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, hidden: int = 128):
        super().__init__()
        self.features = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_channels * image_size * image_size, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Linear(hidden, num_classes)


class CNN2(_Backbone):
    """DENSE/FedHydra 2-layer CNN: [conv5x5(16, pad 2) -> BN -> ReLU -> maxpool2],
    [conv5x5(32, pad 2) -> BN -> ReLU -> maxpool2], linear (1568 -> C at 28 px)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, kernel_size=5, padding=2),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=5, padding=2),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(_flat_dim(self.features, in_channels, image_size), num_classes)


class CNN3(_Backbone):
    """3-layer CNN for 32-px colour input, no BN, no padding:
    conv3x3(128) -> ReLU -> maxpool2 (32->30->15),
    conv3x3(128) -> ReLU -> maxpool2 (15->13->6),
    conv3x3(128) -> ReLU             (6->4),
    linear 128*4*4 = 2048 -> C.  At 28 px the embedding is 128*3*3 = 1152.
    (Pooling after the third conv too would leave 512 features, not the 2048
    that the spec quotes, hence no third pool.)"""

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 128, kernel_size=3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(128, 128, kernel_size=3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(128, 128, kernel_size=3),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Linear(_flat_dim(self.features, in_channels, image_size), num_classes)


class LeNet(_Backbone):
    """LeNet-5 with ReLU and max pooling: conv5x5(6) -> pool -> conv5x5(16) -> pool
    -> fc120 -> fc84 -> classifier. The embedding is the 84-d fc output.
    A 28-px input gets padding 2 in the first conv (LeNet-5 padded MNIST to 32 px),
    so both sizes give 16*5*5 = 400 conv features."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        conv = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=2 if image_size == 28 else 0),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.features = nn.Sequential(
            conv,
            nn.Linear(_flat_dim(conv, in_channels, image_size), 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Linear(84, num_classes)


class ResNet18(_Backbone):
    """CIFAR-style ResNet-18: 3x3 stem (64), no initial max pool, four stages of two
    BasicBlocks (64/128/256/512, stride 1/2/2/2), adaptive average pool, linear 512 -> C."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        # Imported here: torchvision.models pulls in torch._dynamo (about 3-4 s of CPU). Processes
        # that train pay it anyway at their first optimizer; the CLI, bad-input errors and a
        # server that only evaluates do not have to.
        from torchvision.models.resnet import BasicBlock

        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, 64, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
        ]
        inplanes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for s in (stride, 1):
                downsample = None
                if s != 1 or inplanes != planes:
                    downsample = nn.Sequential(
                        nn.Conv2d(inplanes, planes, kernel_size=1, stride=s, bias=False),
                        nn.BatchNorm2d(planes),
                    )
                layers.append(BasicBlock(inplanes, planes, stride=s, downsample=downsample))
                inplanes = planes
        # Adaptive pooling makes the 512-d embedding independent of the input size.
        layers.append(nn.AdaptiveAvgPool2d(1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)


def _conv_bn_relu(cin: int, cout: int, kernel_size: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel_size, padding=kernel_size // 2),
            nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class _Inception(nn.Module):
    """kuangliu/pytorch-cifar Inception block: 1x1 | 1x1->3x3 | 1x1->3x3->3x3
    (two 3x3 in place of the 5x5) | maxpool3->1x1, concatenated on channels."""

    def __init__(self, cin: int, n1: int, n3r: int, n3: int, n5r: int, n5: int, pool_proj: int):
        super().__init__()
        self.b1 = nn.Sequential(*_conv_bn_relu(cin, n1, 1))
        self.b2 = nn.Sequential(*_conv_bn_relu(cin, n3r, 1), *_conv_bn_relu(n3r, n3, 3))
        self.b3 = nn.Sequential(*_conv_bn_relu(cin, n5r, 1), *_conv_bn_relu(n5r, n5, 3),
                                *_conv_bn_relu(n5, n5, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), *_conv_bn_relu(cin, pool_proj, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


class GoogLeNet(_Backbone):
    """CIFAR GoogLeNet (kuangliu/pytorch-cifar): 3x3 stem (192) instead of the
    ImageNet 7x7/maxpool stem, inception 3a-3b, pool, 4a-4e, pool, 5a-5b,
    adaptive average pool, linear 1024 -> C."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int):
        super().__init__()
        self.features = nn.Sequential(
            *_conv_bn_relu(in_channels, 192, 3),
            _Inception(192, 64, 96, 128, 16, 32, 32),
            _Inception(256, 128, 128, 192, 32, 96, 64),
            nn.MaxPool2d(3, stride=2, padding=1),
            _Inception(480, 192, 96, 208, 16, 48, 64),
            _Inception(512, 160, 112, 224, 24, 64, 64),
            _Inception(512, 128, 128, 256, 24, 64, 64),
            _Inception(512, 112, 144, 288, 32, 64, 64),
            _Inception(528, 256, 160, 320, 32, 128, 128),
            nn.MaxPool2d(3, stride=2, padding=1),
            _Inception(832, 256, 160, 320, 32, 128, 128),
            _Inception(832, 384, 192, 384, 48, 128, 128),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(1024, num_classes)


_DESCRIPTIONS: dict[str, str] = {
    "convnet": "DM ConvNet: depth x [conv3x3(width) -> norm -> ReLU -> avgpool2], linear (FedAF/FedDM/DynaFed)",
    "mlp": "MLP in-hidden-hidden-C, 784-128-128-C on 28-px grey (DynaFed)",
    "cnn2": "2-layer CNN, conv5 16/32 + BN + maxpool, linear 1568->C at 28 px (DENSE/FedHydra)",
    "cnn3": "3-layer CNN, three conv3 128 no padding, no BN, linear 2048->C at 32 px",
    "lenet": "LeNet-5 (ReLU, max pool): conv5 6, conv5 16, fc120, fc84, classifier",
    "resnet18": "ResNet-18, CIFAR-style 3x3 stem without max pool, 512-d embedding",
    "googlenet": "GoogLeNet, CIFAR-style (kuangliu/pytorch-cifar) 3x3 stem, 1024-d embedding",
}


def describe_models() -> list[tuple[str, str]]:
    """(name, one-line description) for every model, in MODEL_NAMES order."""
    return [(name, _DESCRIPTIONS[name]) for name in MODEL_NAMES]


def _check_positive(value: int, what: str, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RaysimError(f"{what} must be a positive integer, got {value!r}: fix {key}")


def build_model(name: str, *, in_channels: int, num_classes: int, image_size: int,
                width: int = 128, depth: int = 3, norm: str = "batchnorm",
                hidden: int = 128) -> nn.Module:
    """Build model ``name`` for ``in_channels`` x ``image_size`` x ``image_size`` input
    and ``num_classes`` outputs.

    ``width``, ``depth`` and ``norm`` are used by ConvNet only, ``hidden`` by the
    MLP only; ``norm`` is validated for every model so a typo never goes unnoticed.
    Raises RaysimError on an unknown name/norm or a non-positive size.
    """
    if name not in MODEL_NAMES:
        raise RaysimError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)} (model.name)")
    if norm not in NORMS:
        raise RaysimError(f"unknown norm {norm!r}: choose one of {', '.join(NORMS)} (model.norm)")
    _check_positive(in_channels, "in_channels", "the dataset's channel count")
    _check_positive(num_classes, "num_classes", "the dataset's class count")
    _check_positive(image_size, "image_size", "the dataset's image size")
    _check_positive(width, "width", "model.width")
    _check_positive(depth, "depth", "model.depth")
    _check_positive(hidden, "hidden", "model.hidden")

    common = dict(in_channels=in_channels, num_classes=num_classes, image_size=image_size)
    if name == "convnet":
        model = ConvNet(**common, width=width, depth=depth, norm=norm)
    elif name == "mlp":
        model = MLP(**common, hidden=hidden)
    else:
        model = {"cnn2": CNN2, "cnn3": CNN3, "lenet": LeNet,
                 "resnet18": ResNet18, "googlenet": GoogLeNet}[name](**common)
    # Channels-last convolution weights make every convolution, norm and pooling layer run in
    # NHWC (the input follows the weights). On CPU that is 1.4-2x faster for these small nets
    # (measured: a DM step of ConvNet width 32, 0.36 s -> 0.17-0.28 s); CUDA supports it too.
    return model.to(memory_format=torch.channels_last)
