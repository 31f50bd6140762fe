"""What every plot shares: one colour and marker per series, and where a long legend goes."""
import textwrap

from hvdps import methods
from hvdps.measure.identity import settings_text


MARKERS = "os^Dv<>"          # 7, prime to tab20's 20 colours: 140 series before a look repeats


def series_styles(labels):
    """{label: (colour, marker)}, one each: matplotlib's ten colours repeat from the eleventh line,
    so past ten the 20 of tab20, and the marker varies too, so no two of a panel's series look
    alike (an emulated pass has 12: three rings, three PS variants with 1, 2 and 4 shards)."""
    import matplotlib
    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: (cmap(i % cmap.N), MARKERS[i % len(MARKERS)]) for i, label in enumerate(labels)}


LEGEND_INSIDE = 6                # more entries than this: one legend beside the row, not over its lines


LEGEND_ROWS = 24                 # entries per column of such a legend


def wrapped(label, width):
    """A run's name on lines of about ``width`` characters for a plot's axis, broken between words and
    after each setting's comma, never inside a word: a run's settings ("[A=1,B=2]") are one word to
    textwrap, which would cut a setting's name in two."""
    return textwrap.fill(label.replace(",", ", "), width, break_long_words=False, break_on_hyphens=False)


def name_of(r, healthy=False):
    """A run as the report names it: its method and mode, its other tasks where a role has more than
    one ("2 PS"), the settings it ran at ("[SETTING=VALUE]", as --backends writes it), and a slow or stalled worker (``healthy``: the method alone, as the unhealthy
    cluster's own tables say it)."""
    many = any(n > 1 for _, n in r.tasks)
    name = methods.label(r.backend, r.mode) + (f" ({methods.tasks_said(r.backend, r.tasks)})" if many else "")
    name += f" [{settings_text(r.settings)}]" if r.settings else ""
    if r.condition is None or healthy:
        return name
    return name + f" [{r.unhealthy.what if r.unhealthy else r.condition}]"
