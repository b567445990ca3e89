"""The built-in variants, one module per family; importing this package registers them with `LOSSES`."""

from prime_rl.trainer.rl.losses.variants import aipo, cispo, custom, dppo, gspo, is_reshape, ppo  # noqa: F401
