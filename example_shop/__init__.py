"""The example shop: a small storefront using the Flask-Gateway extension (see the example-shop docs)."""
