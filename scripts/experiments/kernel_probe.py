"""fairseq-train with a read-only record of the SVGD kernel of ``repulsive_adam``: a per-run hook of the table runner.

    python -m diverse_fairseq.tables configs/experiments/repulsive_diagnosis.yaml \
        --train-hook scripts/experiments/kernel_probe.py ...
    .venv/bin/python scripts/experiments/kernel_probe.py FAIRSEQ-TRAIN-ARGUMENTS...

The table runner starts this script in place of ``python -m fairseq_cli.train``, with the same arguments
(``--train-hook``). It registers an observer on the repulsive optimizer
(:func:`diverse_fairseq.methods.repulsive.particle_adam.add_svgd_observer`) and runs fairseq-train in this process.
On the first SVGD update and every ``PROBE_EVERY`` (default 20) updates it appends one JSON line to
``<--save-dir>/kernel_stats.jsonl`` with statistics over all particle sets (the per-head Q/K/V blocks of every
attention module) of that update; a run without ``--optimizer repulsive_adam`` trains as usual and writes nothing:

* ``kappa_offdiag_*``: the kernel values κ_ij, i ≠ j (mean, median, min, max);
* ``self_share``: κ_ii / Σ_j κ_ij, the weight of a head's own gradient in its driving term (1 = plain Adam);
* ``mix_ratio``: ‖Σ_{j≠i} κ_ij g_j‖ / ‖g_i‖, how large the other heads' share is next to the head's own gradient;
* ``cos_drive_own``: cos(Σ_j κ_ij g_j, g_i), the direction change the driving term makes;
* ``cos_grads``: mean cos(g_i, g_j), i ≠ j, between the heads' own loss gradients;
* ``repulse_ratio``: ‖α f Σ_j κ_ij (θ_i − θ_j)‖ / ‖Σ_j κ_ij g_j‖, the repulsive term next to the driving term;
* ``median_dist``, ``bandwidth``: median distance between heads of a set and the bandwidth h (means over sets).

The statistics are computed from copies of the optimizer's inputs: the update itself is untouched.
"""

import json
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import diverse_fairseq  # noqa: E402,F401  (registers the plugin before fairseq imports the user dir)
from diverse_fairseq.methods.repulsive import particle_adam  # noqa: E402
from diverse_fairseq.methods.repulsive.svgd import rbf_kernel  # noqa: E402
from diverse_fairseq.runs.identity import parse_train_args  # noqa: E402


def kernel_stats(theta, grad, alpha, bandwidth, grad_scale=None):
    """The statistics listed in the module docstring for particle sets ``theta``, ``grad`` [G, M, D]."""
    th, g = theta.double(), grad.double()
    if grad_scale is not None:
        g = g * grad_scale
    g_sets, m, _ = th.shape
    d2 = torch.cdist(th, th).pow(2)  # [G, M, M]
    d2.diagonal(dim1=1, dim2=2).zero_()
    kernel, factor = rbf_kernel(d2, bandwidth)  # [G, M, M], [G]
    off = ~torch.eye(m, dtype=torch.bool).expand(g_sets, m, m)
    k_off = kernel[off]
    drive = torch.bmm(kernel, g)  # [G, M, D]
    others = drive - kernel.diagonal(dim1=1, dim2=2).unsqueeze(-1) * g
    rep = alpha * factor.view(-1, 1, 1) * (kernel.sum(-1, keepdim=True) * th - torch.bmm(kernel, th))
    gn = torch.nn.functional.normalize(g, dim=-1)
    cos_g = torch.bmm(gn, gn.transpose(1, 2))[off]
    rows, cols = torch.triu_indices(m, m, 1)
    dist = d2[:, rows, cols].sqrt()
    norm = lambda x: x.norm(dim=-1)  # noqa: E731
    return {
        "kappa_offdiag_mean": k_off.mean().item(), "kappa_offdiag_median": k_off.median().item(),
        "kappa_offdiag_min": k_off.min().item(), "kappa_offdiag_max": k_off.max().item(),
        "self_share": (kernel.diagonal(dim1=1, dim2=2) / kernel.sum(-1)).mean().item(),
        "mix_ratio": (norm(others) / norm(g).clamp_min(1e-30)).mean().item(),
        "cos_drive_own": torch.nn.functional.cosine_similarity(drive, g, dim=-1).mean().item(),
        "cos_grads": cos_g.mean().item(),
        "repulse_ratio": (norm(rep) / norm(drive).clamp_min(1e-30)).mean().item(),
        "median_dist": dist.median(dim=-1).values.mean().item(),
        "bandwidth": (torch.where(factor > 0, 1.0 / factor.clamp_min(1e-300), torch.zeros_like(factor))).mean().item()
        * (2.0 if bandwidth != "authors" else 1.0),
        "sets": g_sets, "heads": m,
    }


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(parse_train_args(args).save_dir)  # fairseq's default: checkpoints
    every = int(os.environ.get("PROBE_EVERY", "20"))
    calls = {"n": 0}

    def record(theta, grad, rule, grad_scale):
        calls["n"] += 1
        if calls["n"] == 1 or calls["n"] % every == 0:
            stats = {"call": calls["n"], **kernel_stats(theta, grad, rule.alpha, rule.bandwidth, grad_scale)}
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "kernel_stats.jsonl", "a") as f:
                f.write(json.dumps(stats) + "\n")

    particle_adam.add_svgd_observer(record)
    print("[kernel_probe] fairseq-train " + " ".join(args), flush=True)
    sys.argv = ["fairseq-train", *args]
    from fairseq_cli.train import cli_main

    cli_main()


if __name__ == "__main__":
    main()
