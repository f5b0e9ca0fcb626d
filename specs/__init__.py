"""Market spec files shipped with the package (``negotiate.specs``): the compact splits the loop and the studies name as
``specs/compact*.toml`` are found from any folder (:func:`negotiate.training.loop.config.shipped_spec`)."""
