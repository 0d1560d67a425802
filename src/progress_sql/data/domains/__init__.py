"""The catalogue of bundled domains: one small module per domain, each declaring ``DOMAIN``.

The order here is the catalogue order; a build shuffles it with the seed to choose its
databases and to split them into train, dev and test.
"""

from __future__ import annotations

from progress_sql.data.domains import (
    bank, car_rental, cinema, company, flights, games, hospital, hotel, library, logistics, museum,
    music, real_estate, restaurant, retail, sports, university, zoo,
)
from progress_sql.data.domains.spec import Column, Domain, DKRule, Table

CATALOGUE: tuple[Domain, ...] = tuple(
    m.DOMAIN for m in (
        university, retail, flights, hospital, music, library, sports, cinema, restaurant, hotel,
        company, bank, car_rental, real_estate, zoo, games, museum, logistics,
    )
)


def get_domain(name: str) -> Domain:
    """The domain called ``name``; KeyError naming the known ones otherwise."""
    for d in CATALOGUE:
        if d.name == name:
            return d
    raise KeyError(f"unknown domain {name!r}; known: {', '.join(d.name for d in CATALOGUE)}")


__all__ = ["CATALOGUE", "Column", "DKRule", "Domain", "Table", "get_domain"]
