"""How an exchange family's latency and bandwidth are fitted from comm.json's rows
(benchmarks/comm_bandwidth.py): each network a method declares (hvdps/methods.py: ``Network``) names
its rule, ``ring`` for the all-reduces, ``push_pull`` for the parameter servers (ps_train/method.py).
Each rule takes [(impl, bytes, seconds)], the ranks the rows were measured with and what to call
the family, and gives an AlphaBeta, or Unfitted with why."""
from hvdps.cost.schedule import AlphaBeta, Unfitted


class Unmeasurable(ValueError):
    """The measurements do not determine latency and bandwidth (see fit_alpha_beta)."""


def fit_alpha_beta(points):
    """Least-squares fit of t = alpha + bytes/B to (bytes, seconds) points -> (alpha, B).

    Refused (Unmeasurable) where the points cannot carry the fit, instead of clamping to a
    latency of 0 or an infinite bandwidth that every projection would then repeat: a fitted
    intercept <= 0 means the smallest exchanges were too fast to separate a latency from the
    noise of the large ones; a slope <= 0, that time did not grow with size."""
    pts = [(float(b), float(t)) for b, t in points if t > 0]
    if len(pts) < 2:
        raise Unmeasurable("need at least two measurements to fit latency and bandwidth")
    n = len(pts)
    mx = sum(b for b, _ in pts) / n
    my = sum(t for _, t in pts) / n
    sxx = sum((b - mx) ** 2 for b, _ in pts)
    slope = sum((b - mx) * (t - my) for b, t in pts) / sxx if sxx else 0.0
    if slope <= 0:
        raise Unmeasurable("the exchange time does not grow with the message size")
    alpha = my - slope * mx
    if alpha <= 0:
        raise Unmeasurable(f"the fitted latency is {alpha * 1e6:.1f} us: the smallest exchanges "
                           f"({min(b for b, _ in pts):,.0f} bytes) are too fast to measure one")
    return alpha, 1.0 / slope


def ring(rows, np_, what):
    """The ring at ``np_`` ranks moves 2(n-1)/n M and pays 2(n-1) alphas, so at 2 ranks
    t = 2 alpha + M/B; the best setting per size is what a tuned trainer gets."""
    best = {}
    for _, size, seconds in rows:
        best[size] = min(best.get(size, float("inf")), seconds)
    try:
        a, b = fit_alpha_beta(best.items())
    except Unmeasurable as exc:
        return Unfitted(f"{what}: {exc}")
    return AlphaBeta(alpha=a / (2 * (np_ - 1)), bandwidth=b * 2.0 * (np_ - 1) / np_)


def push_pull(rows, np_, what):
    """A push and a pull each pay one alpha and move M once: each is fitted on its own rows
    (``*-push``, ``*-pull``), and the network is their mean latency and harmonic-mean bandwidth."""
    fitted, bad = {}, []
    for way in ("push", "pull"):
        points = [(size, seconds) for impl, size, seconds in rows if impl.endswith("-" + way)]
        if not points:
            continue
        try:
            a, b = fit_alpha_beta(points)
            fitted[way] = AlphaBeta(alpha=a, bandwidth=b)
        except Unmeasurable as exc:
            bad.append(f"{what} {way}: {exc}")
    if bad:
        return Unfitted("; ".join(bad))
    missing = [way for way in ("push", "pull") if way not in fitted]
    if missing:
        return Unfitted(f"{what}: comm.json has no {' or '.join(missing)} rows")
    push, pull = fitted["push"], fitted["pull"]
    return AlphaBeta(alpha=(push.alpha + pull.alpha) / 2, bandwidth=2 / (1 / push.bandwidth + 1 / pull.bandwidth))
