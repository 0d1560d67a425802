"""The catalogue of bundled domains: the hand-written ones (one small module per domain, each
declaring ``DOMAIN``) and the composed ones (``compose``: ``VARIANTS`` per sector of
``sectors.SECTORS``, each sector a family).

The order here is the catalogue order; a build shuffles its families with the seed to choose
its databases and to split them into train, dev and test (``data.build.split_domains``).
"""

from __future__ import annotations

from progress_sql.data.domains import (
    bank, car_rental, cinema, company, flights, games, hospital, hotel, library, logistics, museum,
    music, real_estate, restaurant, retail, sports, university, zoo,
)
from progress_sql.data.domains.compose import VARIANTS, compose
from progress_sql.data.domains.sectors import SECTORS
from progress_sql.data.domains.spec import Column, Domain, DKRule, Table

HAND_WRITTEN: tuple[Domain, ...] = tuple(
    m.DOMAIN for m in (
        university, retail, flights, hospital, music, library, sports, cinema, restaurant, hotel,
        company, bank, car_rental, real_estate, zoo, games, museum, logistics,
    )
)
CATALOGUE: tuple[Domain, ...] = HAND_WRITTEN + tuple(compose(s, k) for s in SECTORS for k in range(VARIANTS))


def get_domain(name: str) -> Domain:
    """The domain called ``name``; KeyError naming the known ones otherwise."""
    for d in CATALOGUE:
        if d.name == name:
            return d
    raise KeyError(f"unknown domain {name!r}; known: {', '.join(d.name for d in CATALOGUE)}")


__all__ = ["CATALOGUE", "Column", "DKRule", "Domain", "HAND_WRITTEN", "Table", "get_domain"]
