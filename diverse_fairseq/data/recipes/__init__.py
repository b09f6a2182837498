"""The dataset recipes, by name."""

from . import custom, demo, iwslt14, wmt14, wmt17
from .base import Archive, Context, Recipe

RECIPES = {r.name: r for r in (demo.RECIPE, demo.FRENCH, iwslt14.RECIPE, wmt14.RECIPE, wmt14.MACARON, wmt17.RECIPE)}
# recipes that the user's options complete (``Recipe.configure``): not a fixed dataset, so not in RECIPES
TEMPLATES = {custom.RECIPE.name: custom.RECIPE}


def get(name: str) -> Recipe:
    try:
        return RECIPES[name] if name in RECIPES else TEMPLATES[name]
    except KeyError:
        raise SystemExit(f"error: unknown dataset {name!r}; "
                         f"choose one of {', '.join([*RECIPES, *TEMPLATES])}") from None


__all__ = ["Archive", "Context", "Recipe", "RECIPES", "TEMPLATES", "get"]
