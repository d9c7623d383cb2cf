"""The sweep's figure: acceptable fraction and cost ratio over K, one line per price range
(dashed: the fraction acceptable within one task's load of every threshold)."""

from __future__ import annotations

from pathlib import Path


def plot_sweep(cells: list[dict], path: Path, *, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lfs = sorted({c["load_factor"] for c in cells})
    es = sorted({c["price_range"] for c in cells})
    fig, axes = plt.subplots(2, len(lfs), figsize=(4.2 * len(lfs), 7), sharex=True, squeeze=False)
    for col, lf in enumerate(lfs):
        for e in es:
            row = sorted((c for c in cells if c["load_factor"] == lf and c["price_range"] == e), key=lambda c: c["contracts_per_participant"])
            ks = [c["contracts_per_participant"] for c in row]
            line, = axes[0][col].plot(ks, [c["acceptable_fraction"] for c in row], marker="o", label=f"E = {e:g}")
            if all("within_one_task_fraction" in c for c in row):
                axes[0][col].plot(ks, [c["within_one_task_fraction"] for c in row], linestyle="--", color=line.get_color(), alpha=0.6)
            axes[1][col].plot(ks, [c["median_cost_ratio"] for c in row], marker="o", label=f"E = {e:g}")
        axes[0][col].set_title(f"load factor {lf:g}")
        axes[0][col].set_ylim(-0.03, 1.03)
        axes[1][col].set_xlabel("contracts per participant K")
    axes[0][0].set_ylabel("runs reaching acceptable\n(dashed: within one task)")
    axes[1][0].set_ylabel("median cost / lower bound")
    axes[1][-1].legend(loc="upper right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
