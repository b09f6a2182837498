"""The dataset recipes, by name."""

from . import demo, iwslt14, wmt14, wmt17
from .base import Archive, Context, Recipe

RECIPES = {r.name: r for r in (demo.RECIPE, iwslt14.RECIPE, wmt14.RECIPE, wmt17.RECIPE)}


def get(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise SystemExit(f"error: unknown dataset {name!r}; choose one of {', '.join(RECIPES)}") from None


__all__ = ["Archive", "Context", "Recipe", "RECIPES", "get"]
