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

``width_multiplier`` scales the channel (and hidden-unit) counts of resnet18,
googlenet, cnn3 and lenet, so 2-core configs can run narrow versions of the
papers' client models (1.0 is the published architecture). ConvNet has its
own absolute ``width``; the MLP its ``hidden``.

A name of the form ``package.module:factory`` builds a user's model: the
factory is called as ``factory(in_channels=..., num_classes=..., image_size=...)``
and must return an ``nn.Module``. Plain training (the FedAvg family, DynaFed)
needs nothing more; distribution matching (FedDM, FedAF), MOON and DCFL also
need the contract above (``embed`` and ``classifier``).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from raysim.errors import RaysimError
from raysim.plugins import load_object
from raysim.resample import GlobalAvgPool

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


def _scaled(channels: int, multiplier: float) -> int:
    """A layer's channel count at `width_multiplier` (at least one channel)."""
    return max(1, int(round(channels * multiplier)))


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

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        width: int = 128,
        depth: int = 3,
        norm: str = "batchnorm",
    ):
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

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width_multiplier: float = 1.0):
        super().__init__()
        c = _scaled(128, width_multiplier)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c, kernel_size=3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c, c, kernel_size=3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c, c, kernel_size=3),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Linear(_flat_dim(self.features, in_channels, image_size), num_classes)


class LeNet(_Backbone):
    """LeNet-5 with ReLU and max pooling: conv5x5(6) -> pool -> conv5x5(16) -> pool
    -> fc120 -> fc84 -> classifier. The embedding is the 84-d fc output.
    A 28-px input gets padding 2 in the first conv (LeNet-5 padded MNIST to 32 px),
    so both sizes give 16*5*5 = 400 conv features."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width_multiplier: float = 1.0):
        super().__init__()
        c1, c2, f1, f2 = (_scaled(n, width_multiplier) for n in (6, 16, 120, 84))
        conv = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=5, padding=2 if image_size == 28 else 0),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.features = nn.Sequential(
            conv,
            nn.Linear(_flat_dim(conv, in_channels, image_size), f1),
            nn.ReLU(inplace=True),
            nn.Linear(f1, f2),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Linear(f2, num_classes)


class ResNet18(_Backbone):
    """CIFAR-style ResNet-18: 3x3 stem (64), no initial max pool, four stages of two
    BasicBlocks (64/128/256/512, stride 1/2/2/2), adaptive average pool, linear 512 -> C."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width_multiplier: float = 1.0):
        # lazy: torchvision.models pulls in torch._dynamo (about 3-4 s of CPU). Processes
        # that train pay it anyway at their first optimizer; the CLI, bad-input errors and a
        # server that only evaluates do not have to.
        from torchvision.models.resnet import BasicBlock

        super().__init__()
        stem = _scaled(64, width_multiplier)
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, stem, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(stem),
            nn.ReLU(inplace=True),
        ]
        inplanes = stem
        for planes, stride in ((_scaled(n, width_multiplier), s) for n, s in ((64, 1), (128, 2), (256, 2), (512, 2))):
            for s in (stride, 1):
                downsample = None
                if s != 1 or inplanes != planes:
                    downsample = nn.Sequential(
                        nn.Conv2d(inplanes, planes, kernel_size=1, stride=s, bias=False),
                        nn.BatchNorm2d(planes),
                    )
                layers.append(BasicBlock(inplanes, planes, stride=s, downsample=downsample))
                inplanes = planes
        # Global pooling makes the 512-d embedding independent of the input size.
        layers.append(GlobalAvgPool())
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(inplanes, num_classes)


def _conv_bn_relu(cin: int, cout: int, kernel_size: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel_size, padding=kernel_size // 2), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class _Inception(nn.Module):
    """kuangliu/pytorch-cifar Inception block: 1x1 | 1x1->3x3 | 1x1->3x3->3x3
    (two 3x3 in place of the 5x5) | maxpool3->1x1, concatenated on channels."""

    def __init__(self, cin: int, n1: int, n3r: int, n3: int, n5r: int, n5: int, pool_proj: int):
        super().__init__()
        self.b1 = nn.Sequential(*_conv_bn_relu(cin, n1, 1))
        self.b2 = nn.Sequential(*_conv_bn_relu(cin, n3r, 1), *_conv_bn_relu(n3r, n3, 3))
        self.b3 = nn.Sequential(*_conv_bn_relu(cin, n5r, 1), *_conv_bn_relu(n5r, n5, 3), *_conv_bn_relu(n5, n5, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), *_conv_bn_relu(cin, pool_proj, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


class GoogLeNet(_Backbone):
    """CIFAR GoogLeNet (kuangliu/pytorch-cifar): 3x3 stem (192) instead of the
    ImageNet 7x7/maxpool stem, inception 3a-3b, pool, 4a-4e, pool, 5a-5b,
    adaptive average pool, linear 1024 -> C."""

    # (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection) of each block; None: a max pool
    BLOCKS = (
        (64, 96, 128, 16, 32, 32),
        (128, 128, 192, 32, 96, 64),
        None,
        (192, 96, 208, 16, 48, 64),
        (160, 112, 224, 24, 64, 64),
        (128, 128, 256, 24, 64, 64),
        (112, 144, 288, 32, 64, 64),
        (256, 160, 320, 32, 128, 128),
        None,
        (256, 160, 320, 32, 128, 128),
        (384, 192, 384, 48, 128, 128),
    )

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width_multiplier: float = 1.0):
        super().__init__()
        channels = _scaled(192, width_multiplier)
        layers: list[nn.Module] = [*_conv_bn_relu(in_channels, channels, 3)]
        for block in self.BLOCKS:
            if block is None:
                layers.append(nn.MaxPool2d(3, stride=2, padding=1))
                continue
            n1, n3r, n3, n5r, n5, pool = (_scaled(n, width_multiplier) for n in block)
            layers.append(_Inception(channels, n1, n3r, n3, n5r, n5, pool))
            channels = n1 + n3 + n5 + pool
        layers.append(GlobalAvgPool())
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)


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


def build_model(
    name: str,
    *,
    in_channels: int,
    num_classes: int,
    image_size: int,
    width: int = 128,
    depth: int = 3,
    norm: str = "batchnorm",
    hidden: int = 128,
    width_multiplier: float = 1.0,
) -> nn.Module:
    """Build model ``name`` for ``in_channels`` x ``image_size`` x ``image_size`` input
    and ``num_classes`` outputs.

    ``width``, ``depth`` and ``norm`` are used by ConvNet only, ``hidden`` by the
    MLP only, ``width_multiplier`` by the models in SCALABLE; ``norm`` is validated
    for every model so a typo never goes unnoticed.
    Raises RaysimError on an unknown name/norm or a non-positive size.
    """
    if ":" in name:
        return _user_model(name, in_channels, num_classes, image_size)
    if name not in MODEL_NAMES:
        raise RaysimError(
            f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)} "
            "or give your own as package.module:factory (model.name)"
        )
    if norm not in NORMS:
        raise RaysimError(f"unknown norm {norm!r}: choose one of {', '.join(NORMS)} (model.norm)")
    _check_positive(in_channels, "in_channels", "the dataset's channel count")
    _check_positive(num_classes, "num_classes", "the dataset's class count")
    _check_positive(image_size, "image_size", "the dataset's image size")
    _check_positive(width, "width", "model.width")
    _check_positive(depth, "depth", "model.depth")
    _check_positive(hidden, "hidden", "model.hidden")
    if isinstance(width_multiplier, bool) or not isinstance(width_multiplier, (int, float)) or width_multiplier <= 0:
        raise RaysimError(
            f"width_multiplier must be a number > 0, got {width_multiplier!r}: fix model.width_multiplier"
        )

    common = dict(in_channels=in_channels, num_classes=num_classes, image_size=image_size)
    if name == "convnet":
        model = ConvNet(**common, width=width, depth=depth, norm=norm)
    elif name == "mlp":
        model = MLP(**common, hidden=hidden)
    elif name == "cnn2":
        model = CNN2(**common)
    else:
        model = {"cnn3": CNN3, "lenet": LeNet, "resnet18": ResNet18, "googlenet": GoogLeNet}[name](
            **common, width_multiplier=width_multiplier
        )
    # Channels-last convolution weights make every convolution, norm and pooling layer run in
    # NHWC (the input follows the weights). On CPU that is 1.4-2x faster for these small nets
    # (measured: a DM step of ConvNet width 32, 0.36 s -> 0.17-0.28 s); CUDA supports it too.
    return _strided_pointwise_convs_contiguous(model.to(memory_format=torch.channels_last))


# oneDNN, behind PyTorch's CPU convolutions, gets the weight gradient of a strided 1x1
# convolution on channels-last input wrong when the layer has fewer input channels than its
# channel block (16 on AVX-512, 8 on AVX2): it writes past a workspace (uxlfoundation/oneDNN
# issue 6035). With 2+ threads and an odd batch that is a segmentation fault on AVX-512; on
# AVX2 a hang or silently wrong gradients. Only such layers (ResNet-18's first shortcut below
# width 1/4) run in the contiguous layout: the same convolution; every other layer stays NHWC.
_ONEDNN_CHANNEL_BLOCK = 16


def _contiguous_input(module: nn.Module, args: tuple) -> tuple:
    return (args[0].contiguous(), *args[1:])


def _strided_pointwise_convs_contiguous(model: nn.Module) -> nn.Module:
    for layer in model.modules():
        if (
            isinstance(layer, nn.Conv2d)
            and layer.kernel_size == (1, 1)
            and layer.stride != (1, 1)
            and layer.in_channels < _ONEDNN_CHANNEL_BLOCK
        ):
            layer.to(memory_format=torch.contiguous_format)
            layer.register_forward_pre_hook(_contiguous_input)
    return model


def _check_factory_signature(factory: Any, path: str) -> None:
    """The factory must accept the three keyword arguments raysim passes, checked before it is called."""

    expected = "def factory(in_channels, num_classes, image_size) returning a torch.nn.Module"
    if not callable(factory):
        raise RaysimError(f"model.name='{path}' is a {type(factory).__name__}, not a factory: write {expected}")
    try:
        inspect.signature(factory).bind(in_channels=1, num_classes=2, image_size=28)
    except (TypeError, ValueError) as exc:
        raise RaysimError(
            f"model.name='{path}' does not take the model arguments in_channels, num_classes, image_size "
            f"({exc}): write {expected}"
        ) from None


def _user_model(path: str, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    """A model from the user's own code, `package.module:factory`."""
    factory = load_object(path, "model.name", "model factory")
    _check_factory_signature(factory, path)
    model = factory(in_channels=in_channels, num_classes=num_classes, image_size=image_size)
    if not isinstance(model, nn.Module):
        raise RaysimError(
            f"model factory '{path}' returned {type(model).__name__}, not a torch.nn.Module: make it return the model"
        )
    return model
