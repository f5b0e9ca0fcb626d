"""Markets: the immutable spec, the generated instance, and the named splits.

A :class:`MarketSpec` is a distribution over markets; :func:`generate` draws one
:class:`Market` from it with a seed, bit for bit reproducibly (one numpy
``Generator`` passed down, no global randomness). Private information (valuations,
costs) lives in the :class:`Market`; agents only ever see it through
``negotiate.regulator.observe``.
"""

from __future__ import annotations

import json

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator
from scipy.special import ndtr

from negotiate.errors import UserError

__all__ = ["MarketSpec", "Market", "Product", "Buyer", "SPLITS", "generate", "load_spec", "resolve_spec", "shipped_spec"]

Range = tuple[StrictInt, StrictInt]


class MarketSpec(BaseModel):
    """How to draw a market. Counts may be a fixed int or an inclusive ``[lo, hi]`` range."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("custom", description="Label carried into traces and report tables.")
    buyers: StrictInt | Range = Field((2, 4), description="Number of buyers, or an inclusive range drawn per market.")
    products: StrictInt | Range = Field((2, 4), description="Number of products, or an inclusive range drawn per market.")
    stock: StrictInt = Field(1, ge=1, le=1000, description="Units in stock of every product.")
    valuation: Literal["uniform", "correlated"] = Field(
        "uniform", description="Independent uniform values, or values correlated through product and buyer factors."
    )
    correlation: float = Field(
        0.7, ge=0.0, le=1.0, description="Share of value variance from common factors (correlated model only)."
    )
    price_low: float = Field(100.0, allow_inf_nan=False, ge=0.0, description="Lowest valuation before scaling.")
    price_high: float = Field(1000.0, allow_inf_nan=False, gt=0.0, description="Highest valuation before scaling.")
    price_scale: float = Field(1.0, allow_inf_nan=False, gt=0.0, description="Multiplies the price range (prices-x10 uses 10).")
    cost_low: float = Field(0.0, ge=0.0, le=1.0, description="Lowest cost, as a fraction of the range above price_low.")
    cost_high: float = Field(0.5, ge=0.0, le=1.0, description="Highest cost, as a fraction of the range above price_low.")
    budget: StrictInt | None = Field(None, ge=1, le=1_000_000, description="Absolute turn budget; overrides budget_per_pair.")
    budget_per_pair: float = Field(1.5, allow_inf_nan=False, gt=0.0, description="Turn budget per buyer-product pair, rounded up.")
    personas: tuple[str, ...] = Field(("neutral",), description="Personas drawn for LLM buyers.")

    @field_validator("name")
    @classmethod
    def _named(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("must not be blank: it labels the split in every trace and report")
        if not name.isprintable():  # a newline or a tab would break every table's rows
            raise ValueError("must be one line of printable text: it labels the split in every trace and report")
        return name

    @field_validator("correlation", "price_low", "price_high", "price_scale", "cost_low", "cost_high", "budget_per_pair",
                     mode="before")
    @classmethod
    def _not_a_switch(cls, value: object) -> object:
        # pydantic reads true as 1.0 in a float field (and budget = true, before StrictInt, as a budget of 1 turn)
        if isinstance(value, bool):
            raise ValueError("must be a number, not true or false")
        return value

    @field_validator("personas", mode="before")
    @classmethod
    def _a_list(cls, personas: object) -> object:
        if isinstance(personas, str):  # a tuple of its characters, else, or pydantic's "Input should be a valid tuple"
            raise ValueError(f"a list of personas: personas = [{json.dumps(personas)}]")
        return personas

    @field_validator("personas")
    @classmethod
    def _personas(cls, personas: tuple[str, ...]) -> tuple[str, ...]:
        # Any text is a persona (one outside the prompt files is described in one line), but not no text.
        if not personas:  # each LLM buyer draws one: an empty list leaves nothing to draw
            raise ValueError(f"give at least one persona ({', '.join(KNOWN_PERSONAS)} or a few words), or leave the field "
                             "out for neutral")
        if any(not persona.strip() for persona in personas):
            raise ValueError(f"a persona must not be blank; give a name ({', '.join(KNOWN_PERSONAS)}) or a few words")
        return personas

    @model_validator(mode="after")
    def _check(self) -> MarketSpec:
        most = 1  # buyer-product pairs, at the most
        for field in ("buyers", "products"):
            value = getattr(self, field)
            lo, hi = (value, value) if isinstance(value, int) else value
            if not 1 <= lo <= hi <= 1000:
                raise ValueError(f"{field}|{value!r}|must be a count or a [lo, hi] range within 1..1000")
            most *= hi
        if self.price_low >= self.price_high:
            raise ValueError(f"price_low|{self.price_low}|must be below price_high ({self.price_high})")
        if not self.price_high * self.price_scale <= MAX_PRICE:  # compared before rounding: round(inf) raises
            raise ValueError(f"price_high|{self.price_high}|times price_scale ({self.price_scale}) must be at most {MAX_PRICE:,}")
        low, high = round(self.price_low * self.price_scale), round(self.price_high * self.price_scale)
        if low >= high:
            raise ValueError(f"price_high|{self.price_high}|and price_low ({self.price_low}) times price_scale ({self.price_scale}) "
                             f"round to whole prices {low} and {high}: widen the range")
        if self.budget is None and not self.budget_per_pair * most <= MAX_BUDGET:
            raise ValueError(f"budget_per_pair|{self.budget_per_pair}|times the most buyer-product pairs ({most}) must be at most "
                             f"{MAX_BUDGET:,} turns")
        if self.cost_low > self.cost_high:
            raise ValueError(f"cost_low|{self.cost_low}|must not exceed cost_high ({self.cost_high})")
        return self


KNOWN_PERSONAS = ("neutral", "begging", "insulting", "unyielding")
"""The personas with a prompt file of their own (``agents/prompts/personas/``)."""
MAX_BUDGET = 10**6
"""The most turns a spec may give a market: a 460 MB trace, and about a minute of a scripted episode, at this cap. Its
memory does not grow with its turns (a long episode spills its events to a file as it goes, ``negotiate.trace``: a
``serve`` of one 10**6-turn episode peaks at about 130 MB, ``benchmarks/bench_long.py --rss``); a 200 x 200 market's
default budget is 60,000."""
MAX_PRICE = 10**12
"""The highest price a spec may draw (a trillion): sums of prices stay exact in floats and in the trace's JSON."""

SPLITS: dict[str, MarketSpec] = {
    "train": MarketSpec(name="train"),
    "shapes": MarketSpec(name="shapes", buyers=(5, 7), products=(3, 6)),
    "correlated": MarketSpec(name="correlated", valuation="correlated", correlation=0.7),
    "prices-x10": MarketSpec(name="prices-x10", price_scale=10.0),
}
"""Named splits: ``train`` is the training distribution, the rest are held out."""


@dataclass(frozen=True, slots=True)
class Product:
    id: str
    """Public id, ``p1``.. ``pN``."""
    name: str
    """Display name."""
    cost: int
    """Seller's unit cost: it never sells below it. Private to the seller."""
    stock: int
    """Units at the start."""


@dataclass(frozen=True, slots=True)
class Buyer:
    id: str
    """Public id, ``b1``.. ``bN``."""
    values: tuple[int, ...]
    """Private valuation of each product, in catalog order."""
    persona: str = "neutral"
    """Persona for LLM buyers."""


@dataclass(frozen=True, slots=True)
class Market:
    """One drawn market: everything an omniscient observer knows."""

    spec: MarketSpec
    seed: int
    products: tuple[Product, ...]
    buyers: tuple[Buyer, ...]
    budget: int
    """Global turn budget: seller messages allowed in the episode."""
    price_low: int
    price_high: int
    """Public price range (after scaling) from which valuations are drawn."""

    @property
    def shape(self) -> str:
        return f"{len(self.buyers)}x{len(self.products)}"

    @property
    def tier(self) -> str:
        return f"{self.price_low}-{self.price_high}"

    def product_index(self, product_id: str) -> int | None:
        """Catalog index of ``product_id``, or None if there is no such product."""
        if product_id[:1] == "p" and product_id[1:].isdigit():
            index = int(product_id[1:]) - 1
            if 0 <= index < len(self.products):
                return index
        return None

    def buyer_index(self, buyer_id: str) -> int | None:
        if buyer_id[:1] == "b" and buyer_id[1:].isdigit():
            index = int(buyer_id[1:]) - 1
            if 0 <= index < len(self.buyers):
                return index
        return None

    def to_dict(self) -> dict:
        """Full private information, as written into the trace's episode_start event."""
        return {
            "seed": self.seed,
            "budget": self.budget,
            "price_low": self.price_low,
            "price_high": self.price_high,
            "products": [{"id": p.id, "name": p.name, "cost": p.cost, "stock": p.stock} for p in self.products],
            "buyers": [{"id": b.id, "values": list(b.values), "persona": b.persona} for b in self.buyers],
        }

    @classmethod
    def from_dict(cls, spec: MarketSpec, data: dict) -> Market:
        """The market a trace recorded; a ValueError saying what is wrong where the record is not one."""
        if not isinstance(data, dict):
            raise ValueError("the episode_start has no market")
        try:
            market = cls(
                spec=spec,
                seed=int(data["seed"]),
                products=tuple(Product(p["id"], p["name"], int(p["cost"]), int(p["stock"])) for p in data["products"]),
                buyers=tuple(Buyer(b["id"], tuple(int(v) for v in b["values"]), b.get("persona", "neutral")) for b in data["buyers"]),
                budget=int(data["budget"]),
                price_low=int(data["price_low"]),
                price_high=int(data["price_high"]),
            )
        except KeyError as error:
            raise ValueError(f"the market lacks {error}") from None
        except (TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"the market is not one ({error})") from None
        short = next((b for b in market.buyers if len(b.values) != len(market.products)), None)
        if short is not None:
            raise ValueError(f"buyer {short.id} has {len(short.values)} values for {len(market.products)} products")
        return market


_CATEGORIES = ("laptop", "e-bike", "espresso machine", "camera", "sofa", "headphones", "tent", "monitor")
_TIERS = ("Lite", "Basic", "Air", "Standard", "Plus", "Sport", "Pro", "Max", "Ultra", "Studio", "Elite", "Prime")


def _draw_count(rng: np.random.Generator, value: int | Range) -> int:
    if isinstance(value, int):
        return value
    return int(rng.integers(value[0], value[1] + 1))


def generate(spec: MarketSpec, seed: int) -> Market:
    """Draw one market from ``spec``; the same spec and seed give the same market.

    All the draws of a market come from one ``Generator`` in a fixed order (counts,
    then one block of uniforms, then normals for the correlated model): a few numpy
    calls per market, since thousands of markets are drawn a second.
    """
    rng = np.random.default_rng(seed)
    n_buyers = _draw_count(rng, spec.buyers)
    n_products = _draw_count(rng, spec.products)
    lo = round(spec.price_low * spec.price_scale)
    hi = round(spec.price_high * spec.price_scale)
    span = hi - lo
    n_cells = n_buyers * n_products
    u = rng.random(n_cells + n_products + 1 + len(_TIERS) + n_buyers)
    if spec.valuation == "uniform":
        values = lo + span * u[:n_cells]
        cost_frac = spec.cost_low + (spec.cost_high - spec.cost_low) * u[n_cells : n_cells + n_products]
    else:
        rho = spec.correlation
        z = rng.standard_normal(n_products + n_buyers + n_cells)
        quality, taste, noise = z[:n_products], z[n_products : n_products + n_buyers], z[n_products + n_buyers :]
        mixed = math.sqrt(rho / 2) * (quality[None, :] + taste[:, None]) + math.sqrt(1 - rho) * noise.reshape(n_buyers, n_products)
        values = lo + span * ndtr(mixed)
        cost_frac = spec.cost_low + (spec.cost_high - spec.cost_low) * ndtr(quality)
    rest = u[n_cells + n_products :].tolist()
    costs = np.rint(lo + span * cost_frac).astype(np.int64).tolist()
    flat = np.rint(values).astype(np.int64).reshape(-1).tolist()
    category = _CATEGORIES[min(int(rest[0] * len(_CATEGORIES)), len(_CATEGORIES) - 1)]
    order = sorted(range(len(_TIERS)), key=rest[1 : 1 + len(_TIERS)].__getitem__)
    personas = spec.personas
    persona_draws = rest[1 + len(_TIERS) :]
    products = tuple(
        Product(
            id=f"p{j + 1}",
            name=f"{_TIERS[order[j % len(_TIERS)]]} {category}" + (f" {j // len(_TIERS) + 1}" if j >= len(_TIERS) else ""),
            cost=costs[j],
            stock=spec.stock,
        )
        for j in range(n_products)
    )
    buyers = tuple(
        Buyer(
            id=f"b{i + 1}",
            values=tuple(flat[i * n_products : (i + 1) * n_products]),
            persona=personas[min(int(persona_draws[i] * len(personas)), len(personas) - 1)],
        )
        for i in range(n_buyers)
    )
    budget = spec.budget if spec.budget is not None else math.ceil(spec.budget_per_pair * n_buyers * n_products)
    return Market(spec=spec, seed=seed, products=products, buyers=buyers, budget=budget, price_low=lo, price_high=hi)


def _in_our_words(problem: dict) -> str:
    """One pydantic problem in the project's words: what the field must be, no library wording."""
    kind, ctx = problem["type"], problem.get("ctx") or {}
    bound = lambda key: f"{ctx[key]:,}" if isinstance(ctx.get(key), int) else f"{ctx.get(key)}"
    words = {
        "finite_number": "must be a finite number",
        "greater_than_equal": f"must be at least {bound('ge')}",
        "greater_than": f"must be above {bound('gt')}",
        "less_than_equal": f"must be at most {bound('le')}",
        "less_than": f"must be below {bound('lt')}",
        "int_type": "must be a whole number", "int_parsing": "must be a whole number", "int_from_float": "must be a whole number",
        "float_type": "must be a number", "float_parsing": "must be a number",
        "string_type": "must be text in quotes", "bool_type": "must be true or false", "bool_parsing": "must be true or false",
        "literal_error": f"must be one of {ctx.get('expected', '')}",
        "extra_forbidden": f"is not a spec field; the fields are {', '.join(MarketSpec.model_fields)}",
        "tuple_type": "must be a list", "too_long": "has too many items", "too_short": "has too few items",
    }
    message = words.get(kind) or problem["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    return message


def _describe_validation_error(source: str, error: ValidationError) -> UserError:
    first = error.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else "(spec)"  # union members (buyers.int) add noise
    more = len(error.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    value = first.get("input")
    message = _in_our_words(first)
    if field in ("buyers", "products") and len(first["loc"]) > 1:  # the int | [lo, hi] union: one problem, said once
        message, suffix = "must be a count or a [lo, hi] range within 1..1000", ""
    if not first["loc"] and message.count("|") >= 2:  # a cross-field check: "field|value|problem"
        field, shown, message = message.split("|", 2)
        return UserError(f"{shown}: {message}{suffix}", source=source, field=field)
    return UserError(message + suffix, source=source, field=field, value=value)


def spec_from_dict(data: dict, source: str) -> MarketSpec:
    """Validate a spec mapping; errors name ``source``, the field and the value."""
    try:
        return MarketSpec.model_validate(data)
    except ValidationError as error:
        raise _describe_validation_error(source, error) from None


def shipped_spec(path: str) -> str:
    """A market spec file as every command reads it: ``path`` where it is a file; else, for ``specs/NAME.toml`` (the
    README's commands, the loop's defaults, the studies' configs), the package's copy (``negotiate.specs``), so that
    they run from any folder; else ``path``, which the reader refuses by name."""
    if Path(path).is_file() or Path(path).parent != Path("specs"):
        return path
    from importlib.resources import files

    shipped = files("negotiate.specs") / Path(path).name
    return str(shipped) if shipped.is_file() else path


def load_spec(path: str | Path) -> MarketSpec:
    """Read a TOML spec file (``specs/NAME.toml`` from any folder: :func:`shipped_spec`). A ``split = "NAME"`` key
    starts from a named split."""
    path = Path(shipped_spec(str(path)))
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError("no such spec file", source=str(path)) from None
    except IsADirectoryError:
        raise UserError("is a folder; give a .toml spec file", source=str(path)) from None
    except UnicodeDecodeError as error:
        raise UserError(f"not UTF-8 text (byte {error.start}); save the spec as UTF-8", source=str(path)) from None
    except OSError as error:
        raise UserError(f"cannot read the spec ({error.strerror or error})", source=str(path)) from None
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"not valid TOML ({error})", source=str(path)) from None
    data = data.get("market", data)
    base = data.pop("split", None)
    if base is not None:
        if base not in SPLITS:
            raise UserError(f"unknown split; choose from {', '.join(SPLITS)}", source=str(path), field="split", value=base)
        data = SPLITS[base].model_dump() | {"name": path.stem} | data
    data.setdefault("name", path.stem)
    return spec_from_dict(data, str(path))


def resolve_spec(name_or_path: str, field: str = "--split") -> MarketSpec:
    """A split name (``train``, ``shapes``, ...) or a path to a TOML spec file; ``field`` names the flag it came from."""
    if name_or_path in SPLITS:
        return SPLITS[name_or_path]
    if name_or_path.endswith(".toml") or Path(name_or_path).exists():
        return load_spec(name_or_path)
    raise UserError(f"unknown split; choose from {', '.join(SPLITS)} or give a .toml spec file", field=field, value=name_or_path)
