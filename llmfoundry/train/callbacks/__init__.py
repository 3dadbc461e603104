"""Callbacks: hooks the trainer calls during a run (``base.Callback``). ``catalog`` names the built-in ones and
``settings`` holds their config sections; each callback's own module (which needs torch) is imported only when a
run builds it."""
