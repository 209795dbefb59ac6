"""Text tables, bar charts and ratios to the best."""

import pytest

from harness.bench.report import bar_chart, curve_chart, format_table, ratio_to_best

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_numbers_right_strings_left():
    table = format_table(
        [["gpu:0", 1345, "1.00x"], ["gpu:1 (emulated)", 875, None], ["all", "2,123", "1.58x"]],
        ["device", "samples/s", "speedup"],
    )
    assert table.splitlines() == [
        "device            samples/s  speedup",
        "----------------  ---------  -------",
        "gpu:0                  1345    1.00x",
        "gpu:1 (emulated)        875        -",
        "all                   2,123    1.58x",
    ]


def test_explicit_alignment_and_float_cells():
    table = format_table([["a", 0.5], ["bb", 12.25]], ["x", "value"], align="rc")
    assert table.splitlines() == [" x  value", "--  -----", " a   0.5", "bb  12.25"]


def test_mixed_column_is_left_aligned_and_no_rows_gives_header():
    assert format_table([["1"], ["OOM"]], ["n"]).splitlines()[2:] == ["1", "OOM"]
    assert format_table([], ["a", "b"]) == "a  b\n-  -"


@pytest.mark.parametrize(
    ("rows", "align", "match"),
    [
        ([["a"]], None, r"row 0=\['a'\]"),
        ([["a", 1]], "lx", r"align='lx'"),
        ([["a", 1]], "l", r"align='l'"),
    ],
)
def test_table_errors_name_the_bad_input(rows, align, match):
    with pytest.raises(ValueError, match=match):
        format_table(rows, ["name", "value"], align=align)


def test_ratio_to_best():
    assert ratio_to_best([1810.0, 2123.0, None, 0]) == pytest.approx([1810 / 2123, 1.0, None, 0.0])
    assert ratio_to_best([None, 0.0]) == [None, None]
    assert ratio_to_best([]) == []
    with pytest.raises(ValueError, match=r"values=\[1.0, nan\]"):
        ratio_to_best([1.0, float("nan")])


def _assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 5000
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_bar_chart_writes_png(tmp_path):
    path = bar_chart(["even 512/512", "58/42"], [1810.0, 2123.0], tmp_path / "split.png", title="1080 Ti + 1080")
    assert path == tmp_path / "split.png"
    _assert_png(path)


@pytest.mark.parametrize("horizontal", [False, True])
def test_bar_chart_with_missing_bar_errors_notes_and_footnote(tmp_path, horizontal):
    path = bar_chart(
        ["even", "58/42", "70/30"],
        [1810.0, 2123.0, None],
        tmp_path / "c" / "split.png",
        title="split ratios",
        notes=[None, "emulated", "OOM"],
        errors=[40.0, 12.5, None],
        footnote="emulated devices",
        horizontal=horizontal,
    )
    _assert_png(path)


def test_bar_chart_rewrite_replaces_the_file(tmp_path):
    path = tmp_path / "x.png"
    bar_chart(["a"], [1.0], path, title="first")
    first = path.read_bytes()
    bar_chart(["a", "b"], [1.0, 2.0], path, title="second", highlight_best=False)
    assert path.read_bytes() != first
    _assert_png(path)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"labels": [], "values": []}, r"labels=\[\]"),
        ({"values": [1.0]}, r"2 bars.*values=\[1.0\]"),
        ({"values": [1.0, float("inf")]}, r"values=\[1.0, inf\]"),
        ({"errors": [1.0, -2.0]}, r"errors=\[1.0, -2.0\]"),
        ({"notes": ["OOM"]}, r"notes=\['OOM'\]"),
    ],
)
def test_bar_chart_errors_name_the_bad_input(tmp_path, kwargs, match):
    args = {"labels": ["a", "b"], "values": [1.0, 2.0], **kwargs}
    with pytest.raises(ValueError, match=match):
        bar_chart(args.pop("labels"), args.pop("values"), tmp_path / "x.png", title="t", **args)
    assert list(tmp_path.iterdir()) == []


def test_curve_chart_writes_png_with_ceilings_and_choice(tmp_path):
    curves = [
        {"label": "GPU:0", "points": [(64, 684.0), (256, 1128.0), (1024, 1345.0)], "fit": (0.049, 1 / 1438),
         "ceiling": 1100, "chosen": (1000, 1340.0)},
        {"label": "GPU:1", "points": [(64, 500.0), (512, 860.0)], "fit": None, "ceiling": 512,
         "ceiling_label": "probed to 512 (step time)", "chosen": None},
    ]
    path = curve_chart(curves, tmp_path / "curves.png", title="seed 000", footnote="emulated")
    _assert_png(path)
    with pytest.raises(ValueError, match="at least one curve"):
        curve_chart([], tmp_path / "none.png", title="x")
