"""How the client models' logits become one teacher.

Logits arrive stacked as (K clients, B samples, C classes).
- `mean_logits`: DENSE's and FedDF's average ensemble (FedHydra's "AE").
- `weighted_logits`: Co-Boosting's learned per-client weights, sum_k w_k f_k / sum_k w_k.
- FedHydra's stratified aggregation (SA), from the stratification scores u (K x C, eq. 2-3):
  `normalise_over_clients` (U_r, eq. 4-5: each class's scores sum to 1 over clients) and
  `normalise_over_classes` (U_c, eq. 6-7: each client's scores sum to 1 over classes), both kept
  as K x C arrays (client rows; the paper's U is their transpose). A class whose u is 0 for every
  client gets equal weights 1/K over the clients (and a client whose u is 0 for every class equal
  weights 1/C over the classes), not a teacher of zeros.
  `tempered_over_clients` is FedHydra's `stratify_weighting: tempered` (its docstring), and
  `max_client_share` the largest share one client holds of a class's teacher weight.
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


def mean_logits(logits: torch.Tensor) -> torch.Tensor:
    return logits.mean(0)


def weighted_logits(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (weights[:, None, None] * logits).sum(0) / weights.sum()


def _normalise(u: np.ndarray, axis: int) -> np.ndarray:
    """u / its sum along `axis`; where that sum is not positive, equal weights along `axis`."""
    u = np.asarray(u, dtype=np.float64)
    total = u.sum(axis, keepdims=True)
    positive = total > 0
    return np.where(positive, u / np.where(positive, total, 1.0), 1.0 / u.shape[axis])


def normalise_over_clients(u: np.ndarray) -> np.ndarray:
    """U_r (eq. 4-5); a class whose u is 0 for every client: 1/K each."""
    return _normalise(u, 0)


def normalise_over_classes(u: np.ndarray) -> np.ndarray:
    """U_c (eq. 6-7); a client whose u is 0 for every class: 1/C each."""
    return _normalise(u, 1)


def tempered_over_clients(u: np.ndarray, temperature: float) -> np.ndarray:
    """U_r at `temperature` tau: u[k, y]^(1/tau) normalised over the clients, i.e. a softmax over the
    clients of log(u) / tau. tau = 1 is eq. 4-5; tau > 1 lowers the largest share smoothly
    (monotonically in tau) towards equal weights over the clients with u > 0; u = 0 stays 0.
    Computed as (u / max_k u)^(1/tau), so no power overflows."""
    u = np.asarray(u, dtype=np.float64)
    top = u.max(0, keepdims=True)
    scaled = u / np.where(top > 0, top, 1.0)
    return normalise_over_clients(np.power(scaled, 1.0 / temperature))


def max_client_share(weights: np.ndarray) -> np.ndarray:
    """Per class (column), the largest share one client (row) holds of the class's client weights,
    after normalising them over the clients: (K, C) -> (C,), from 1/K (equal) to 1 (one client)."""
    return normalise_over_clients(np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)).max(0)


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
