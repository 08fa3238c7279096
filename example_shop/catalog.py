"""The products, as code: a small homeware range priced in Rand (whole cents)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "BRANDS",
    "CATEGORIES",
    "MAIN_BRAND",
    "PRODUCTS",
    "SECOND_BRAND",
    "Product",
    "by_category",
    "by_sku",
    "find",
]

#: The shop's own brand: every product unless it says otherwise, sold on ``SHOP_GATEWAY_ACCOUNT``.
MAIN_BRAND: Final = "Stoep"
#: The second brand (fire and light), sold on its own merchant account when ``SHOP_SECOND_ACCOUNT`` is set
#: (docs/example-shop.md, "Two brands, two merchant accounts"); otherwise on the shop's one account.
SECOND_BRAND: Final = "Vuurhout"
BRANDS: Final = (MAIN_BRAND, SECOND_BRAND)


@dataclass(frozen=True)
class Product:
    slug: str
    sku: str
    name: str
    #: One line for the cards; ``description`` for the product page.
    tagline: str
    description: str
    price_cents: int
    #: An SVG under ``static/shop/products/``.
    image: str
    category: str
    #: Also sent to the gateway as the item's search terms.
    tags: tuple[str, ...] = ()
    #: Whose product it is: with two merchant accounts, the brand chooses the checkout's account.
    brand: str = MAIN_BRAND

    @property
    def image_path(self) -> str:
        """The image's path under the app's static folder (for ``url_for("static", filename=...)``)."""
        return f"shop/products/{self.image}"


PRODUCTS: Final[tuple[Product, ...]] = (
    Product(
        slug="enamel-kettle",
        sku="STP-KIT-001",
        name="Enamel stovetop kettle",
        tagline="1.7 litres, speckled blue enamel",
        description=(
            "A generous 1.7 litre kettle in speckled blue enamel over steel, with a cool-touch beech "
            "handle. Works on gas, electric and induction hobs, and whistles when the water boils."
        ),
        price_cents=39900,
        image="enamel-kettle.svg",
        category="Kitchen",
        tags=("kettle", "enamel", "stovetop"),
    ),
    Product(
        slug="stoneware-mugs",
        sku="STP-KIT-002",
        name="Stoneware mugs, set of four",
        tagline="Glazed by hand in four earth tones",
        description=(
            "Four 350 ml stoneware mugs, each glazed by hand in a different earth tone: clay, sage, "
            "sand and ink. Dishwasher and microwave safe."
        ),
        price_cents=28900,
        image="stoneware-mugs.svg",
        category="Kitchen",
        tags=("mug", "stoneware", "coffee"),
    ),
    Product(
        slug="rooibos-tin",
        sku="STP-PAN-001",
        name="Rooibos tea tin",
        tagline="80 loose-leaf servings from the Cederberg",
        description=(
            "Organic loose-leaf rooibos from the Cederberg mountains in a reusable tin. Naturally "
            "caffeine free; steep for five minutes, with or without milk."
        ),
        price_cents=4500,
        image="rooibos-tin.svg",
        category="Pantry",
        tags=("tea", "rooibos"),
    ),
    Product(
        slug="ilala-basket",
        sku="STP-HOM-001",
        name="Ilala palm basket",
        tagline="Woven by hand in KwaZulu-Natal",
        description=(
            "A lidded basket woven from ilala palm in KwaZulu-Natal, with the traditional zigzag "
            "pattern. 30 cm across: for bread, fruit or the odds and ends of a hallway table."
        ),
        price_cents=64900,
        image="ilala-basket.svg",
        category="Home",
        tags=("basket", "woven", "ilala"),
    ),
    Product(
        slug="mohair-throw",
        sku="STP-HOM-002",
        name="Mohair throw",
        tagline="Karoo mohair, 130 x 180 cm",
        description=(
            "A light, warm throw of Karoo mohair, woven in the Eastern Cape. 130 x 180 cm with a "
            "fringed edge, in a soft ochre stripe."
        ),
        price_cents=119900,
        image="mohair-throw.svg",
        category="Home",
        tags=("throw", "blanket", "mohair"),
    ),
    Product(
        slug="brass-desk-lamp",
        sku="STP-LIG-001",
        name="Brass desk lamp",
        tagline="Adjustable arm, warm LED bulb included",
        description=(
            "A solid brass desk lamp with an adjustable arm and a weighted base, wired with a fabric "
            "cord. Comes with a warm 2700 K LED bulb."
        ),
        price_cents=185000,
        image="brass-desk-lamp.svg",
        category="Lighting",
        tags=("lamp", "brass", "desk"),
        brand=SECOND_BRAND,
    ),
    Product(
        slug="potjie-pot",
        sku="STP-KIT-003",
        name="Cast-iron potjie pot",
        tagline="Size 3, for the fire or the oven",
        description=(
            "A three-legged, size 3 cast-iron potjie pot (7.5 litres): slow-cook on coals or in the "
            "oven. Seasoned and ready to use; feeds eight to ten."
        ),
        price_cents=249900,
        image="potjie-pot.svg",
        category="Kitchen",
        tags=("potjie", "cast iron", "braai"),
        brand=SECOND_BRAND,
    ),
    Product(
        slug="woven-rug",
        sku="STP-HOM-003",
        name="Hand-woven wool rug",
        tagline="2 x 3 m, natural dyes",
        description=(
            "A flat-woven rug of undyed and plant-dyed wool, 2 x 3 metres, made on a floor loom over "
            "six weeks. Every rug differs a little from the next."
        ),
        price_cents=1250000,
        image="woven-rug.svg",
        category="Home",
        tags=("rug", "wool", "hand-woven"),
    ),
)

_BY_SLUG: Final = {product.slug: product for product in PRODUCTS}
_BY_SKU: Final = {product.sku: product for product in PRODUCTS}
CATEGORIES: Final[tuple[str, ...]] = tuple(dict.fromkeys(product.category for product in PRODUCTS))


def find(slug: str) -> Product | None:
    return _BY_SLUG.get(slug)


def by_sku(sku: str) -> Product | None:
    return _BY_SKU.get(sku)


def by_category(category: str | None) -> tuple[Product, ...]:
    if not category:
        return PRODUCTS
    return tuple(product for product in PRODUCTS if product.category == category)
