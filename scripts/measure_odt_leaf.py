"""How the ODT leaf convention (``odt.leaf_score``) moves F_struct on real Spider predictions.

Reads ``dev_gold.txt`` and ``dev_predict.txt`` of the conformance corpus
(``PROGRESS_SQL_CONFORMANCE``) and prints, per convention, the spread of F_struct, the mean
structural gain left to a revision (1 − F_struct over non-identical pairs), the score of two
unrelated flat queries, and how many pairs of pairs change order between the conventions.

    PROGRESS_SQL_CONFORMANCE=<spider conformance folder> python scripts/measure_odt_leaf.py
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
from pathlib import Path

from progress_sql.odt import structural_score
from progress_sql.odt.settings import ODTSettings


def main() -> int:
    folder = Path(os.environ.get("PROGRESS_SQL_CONFORMANCE", ""))
    if not (folder / "dev_gold.txt").is_file():
        print("set PROGRESS_SQL_CONFORMANCE to the Spider conformance folder (dev_gold.txt, dev_predict.txt)")
        return 1
    golds = [line.split("\t")[0] for line in (folder / "dev_gold.txt").read_text().splitlines() if line.strip()]
    preds = [line.strip() for line in (folder / "dev_predict.txt").read_text().splitlines() if line.strip()]
    pairs = list(zip(preds, golds))
    scores = {}
    for convention in ("one", "local"):
        settings = ODTSettings(leaf_score=convention)
        vals = [structural_score(p, g, settings) for p, g in pairs]
        gains = [1 - v for (p, g), v in zip(pairs, vals) if " ".join(p.lower().split()) != " ".join(g.lower().split())]
        unrelated = structural_score("SELECT x FROM t", "SELECT y FROM u", settings)
        print(f"leaf_score {convention:5s}: {len(vals)} pairs, F_struct mean {statistics.mean(vals):.3f} "
              f"stdev {statistics.pstdev(vals):.3f}; gain left to a revision (1 - F) mean "
              f"{statistics.mean(gains):.3f} stdev {statistics.pstdev(gains):.3f}; unrelated flat pair {unrelated:.3f}")
        scores[convention] = vals
    a, b = scores["one"], scores["local"]
    flips = sum(1 for i, j in itertools.combinations(range(len(a)), 2) if (a[i] - a[j]) * (b[i] - b[j]) < 0)
    total = len(a) * (len(a) - 1) // 2
    print(f"pairs of pairs whose order flips: {flips} of {total} ({flips / total:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
