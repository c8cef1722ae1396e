"""Every plot the package draws, checked on the rendered figure: each plotted point, marker and all,
lies inside its axes (nothing clipped at the top or the sides), and every legend sits outside the
axes, so it covers no data, yet inside the figure, so the saved PNG does not cut it off."""

from __future__ import annotations

import pytest

from cupy_nwt.nwt.trials import Measurement
from cupy_nwt.nwt.tune import tune_num_workers
from cupy_nwt.picks.store import TuneResult

pytest.importorskip("matplotlib")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from test_transfers import GEN5, _constant_result  # noqa: E402

from cupy_nwt.cli import plots  # noqa: E402

TOL = 0.5  # pixels: a point exactly on the axes' edge (axhline ends) is inside


def _render(fig):
    FigureCanvasAgg(fig).draw()
    return fig


def _marker_radius_px(line, fig) -> float:
    if line.get_marker() in (None, "None", "none", "", " "):
        return 0.0
    return line.get_markersize() * fig.dpi / 72 / 2 + line.get_markeredgewidth() * fig.dpi / 72 / 2


def _plotted(ax):
    """(display x, display y, radius) of every point of every line and filled band of ``ax``."""
    fig = ax.figure
    for line in ax.get_lines():
        r = _marker_radius_px(line, fig)
        for x, y in line.get_transform().transform(line.get_xydata()):
            yield x, y, r
    for coll in ax.collections:
        for path in coll.get_paths():
            for x, y in coll.get_transform().transform(path.vertices):
                yield x, y, 0.0


def _check_layout(fig) -> int:
    """Assert the layout promises for every axes of ``fig``; return how many points were checked."""
    _render(fig)
    figure_box = fig.bbox
    checked = 0
    for ax in fig.axes:
        box = ax.get_window_extent()
        for x, y, r in _plotted(ax):
            assert box.x0 - TOL <= x - r and x + r <= box.x1 + TOL, (ax.get_title(), x, r, box)
            assert box.y0 - TOL <= y - r and y + r <= box.y1 + TOL, (ax.get_title(), y, r, box)
            checked += 1
        legend = ax.get_legend()
        if legend is not None:
            lb = legend.get_window_extent()
            assert not lb.overlaps(box), (ax.get_title(), lb, box)
            assert figure_box.x0 <= lb.x0 and lb.x1 <= figure_box.x1 + TOL, (lb, figure_box)
            assert figure_box.y0 <= lb.y0 and lb.y1 <= figure_box.y1 + TOL, (lb, figure_box)
    return checked


def _tune(curve, strategy="paper", memory=True, alpha=0.5) -> TuneResult:
    def measure(w, iterations, warmup):
        mem = (100 + 37 * w) * 2**20 if memory else None
        return Measurement(curve[w], curve[w] * (iterations + warmup), mem, mem and mem // 2)

    return tune_num_workers(max_workers=len(curve), strategy=strategy, iterations=20, alpha=alpha,
                            measure=measure, progress=False)


VALLEY = [0.2, 0.11, 0.07, 0.05, 0.045, 0.044, 0.05, 0.06, 0.08, 0.1, 0.12, 0.13, 0.15, 0.16, 0.18, 0.2]


@pytest.mark.parametrize("link", [GEN5, None], ids=["with-link", "no-link"])
def test_bandwidth_plot_keeps_points_inside_and_the_legend_outside(link):
    assert _check_layout(plots.bandwidth_figure(_constant_result(link))) > 12


def test_bandwidth_plot_with_one_size():
    result = _constant_result(GEN5)
    one = [p for p in result.points if p.nbytes == result.points[0].nbytes]
    from dataclasses import replace

    assert _check_layout(plots.bandwidth_figure(replace(result, points=tuple(one)))) >= 4


@pytest.mark.parametrize("case", [
    pytest.param(dict(curve=VALLEY), id="paper-valley"),
    pytest.param(dict(curve=list(reversed(VALLEY))), id="paper-pick-last"),  # the pick is the top-right point
    pytest.param(dict(curve=[0.3, 0.05, 0.3, 0.3, 0.3], alpha=0.0), id="paper-spike"),
    pytest.param(dict(curve=VALLEY, strategy="fast"), id="fast"),
    pytest.param(dict(curve=VALLEY, strategy="fast", memory=False), id="fast-no-memory"),
    pytest.param(dict(curve=[0.1, 0.05]), id="two-counts"),
    pytest.param(dict(curve=[0.0209, 0.0211], strategy="fast"), id="fast-two-counts"),  # once cut at the top
])
def test_tune_plot_keeps_points_inside_and_legends_outside(case):
    result = _tune(**case)
    assert _check_layout(plots.tune_figure(result)) >= len(result.trials) + 2


def test_tune_plot_of_one_trial_and_of_none():
    one = _tune([0.05], strategy="paper")
    assert _check_layout(plots.tune_figure(one)) >= 2
    none = _tune([0.05], strategy="fast")
    assert not none.trials
    assert _check_layout(plots.tune_figure(none)) == 0


def test_the_pick_is_drawn_and_circled_where_it_was_measured():
    result = _tune(VALLEY)
    fig = _render(plots.tune_figure(result))
    ax_t = fig.axes[0]
    circles = [ln for ln in ax_t.get_lines() if ln.get_label().startswith("pick:")]
    assert len(circles) == 1
    assert list(circles[0].get_xydata()[0]) == pytest.approx([result.best_workers,
                                                              result.best_trial.seconds_per_iteration * 1e3])


def test_plot_files_are_pngs(tmp_path):
    out = plots.plot_tune(_tune(VALLEY), tmp_path / "deep" / "t.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in out.parent.iterdir()] == ["t.png"]  # no temporary file left beside it
