"""How the client models' logits become one teacher.

Logits arrive stacked as (K clients, B samples, C classes).
- `mean_logits`: DENSE's and FedDF's average ensemble (FedHydra's "AE").
- `weighted_logits`: Co-Boosting's learned per-client weights, sum_k w_k f_k / sum_k w_k.
- FedHydra's stratified aggregation (SA), from the stratification scores u (K x C, eq. 2-3):
  `normalise_over_clients` (U_r, eq. 4-5: each class's scores sum to 1 over clients) and
  `normalise_over_classes` (U_c, eq. 6-7: each client's scores sum to 1 over classes), both kept
  as K x C arrays (client rows; the paper's U is their transpose).
  `stratified_logits` is eq. 10-11: for a sample whose target label is y, the clients' logits
  summed with weights W[:, y] (W = U_r, or the raw u), each first scaled per class by U_c[k]
  (eq. 8) when `over_classes` is given. Without eq. 8 this is the teacher the authors' released
  code builds (its per-client class weights stay 1); with it, the paper's literal eq. 8-11.
  Eq. 8 on logits depends on each client's arbitrary logit offset: z_k + c gives client k the
  same probabilities, but U_c[k] (.) (z_k + c) shifts class j by U_c[k, j] c, a different amount
  per class, which can change the teacher's argmax; without eq. 8 the shift is the same for every
  class, so the teacher's probabilities do not move.
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
    """Eq. 8-11: (K, B, C) logits, (B,) target labels, the client weights (U_r or u) and U_c (or
    None: no eq. 8) as (K, C) tensors -> (B, C)."""
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
