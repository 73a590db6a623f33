"""How the client models' logits become one teacher.

Logits arrive stacked as (K clients, B samples, C classes).
- `mean_logits`: DENSE's and FedDF's average ensemble (FedHydra's "AE").
- `weighted_logits`: Co-Boosting's learned per-client weights, sum_k w_k f_k / sum_k w_k.
- FedHydra's stratified aggregation (SA), from the stratification scores u (K x C, eq. 2-3):
  `normalise_over_clients` (U_r, eq. 4-5: each class's scores sum to 1 over clients) and
  `normalise_over_classes` (U_c, eq. 6-7: each client's scores sum to 1 over classes), both kept
  as K x C arrays (client rows; the paper's U is their transpose).
  `stratified_logits` is eq. 8-11: client k's logits scaled per class by U_c[k] (eq. 8), then, for
  a sample whose target label is y, summed over clients with weights U_r[:, y] (eq. 10-11);
  without U_c (None) the logits are not scaled (SA without eq. 8, an ablation).
  It needs the target label, which synthetic samples have. `stratified_predict` is the
  label-free reading used to evaluate SA on test data (Fig. 7): every class c is tried as the
  target, P^(c) = eq. 11 with y = c, and the prediction is the class whose own teacher is most
  confident in it, argmax_c log_softmax(P^(c))_c.
"""

from __future__ import annotations

import numpy as np
import torch

_EPS = 1e-12


def mean_logits(logits: torch.Tensor) -> torch.Tensor:
    return logits.mean(0)


def weighted_logits(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (weights[:, None, None] * logits).sum(0) / weights.sum()


def normalise_over_clients(u: np.ndarray) -> np.ndarray:
    """U_r (eq. 4-5)."""
    return u / np.maximum(u.sum(0, keepdims=True), _EPS)


def normalise_over_classes(u: np.ndarray) -> np.ndarray:
    """U_c (eq. 6-7)."""
    return u / np.maximum(u.sum(1, keepdims=True), _EPS)


def _scaled_per_class(logits: torch.Tensor, over_classes: torch.Tensor | None) -> torch.Tensor:
    """Eq. 8: P_hat_k = P_k (.) U_c(:, k); None leaves the logits as they are."""
    return logits if over_classes is None else logits * over_classes[:, None, :]


def stratified_logits(
    logits: torch.Tensor, targets: torch.Tensor, over_clients: torch.Tensor, over_classes: torch.Tensor | None
) -> torch.Tensor:
    """Eq. 8-11: (K, B, C) logits, (B,) target labels, U_r and U_c as (K, C) tensors -> (B, C)."""
    scaled = _scaled_per_class(logits, over_classes)  # eq. 8
    v = over_clients[:, targets]  # eq. 10: V, here (K, B)
    return (v[:, :, None] * scaled).sum(0)  # eq. 11


def stratified_predict(
    logits: torch.Tensor, over_clients: torch.Tensor, over_classes: torch.Tensor | None
) -> torch.Tensor:
    """Label-free SA scores for evaluation: (K, B, C) -> (B, C), column c = log_softmax(P^(c))_c."""
    scaled = _scaled_per_class(logits, over_classes)  # eq. 8
    per_target = torch.einsum("kc,kbj->cbj", over_clients, scaled)  # eq. 11 for every y = c
    log_probs = torch.log_softmax(per_target, dim=2)  # (C targets, B, C)
    classes = torch.arange(logits.shape[2], device=logits.device)
    return log_probs[classes, :, classes].T
