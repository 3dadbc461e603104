"""Every dtype name a recipe or a command-line flag may use (fsdp_config.mixed_precision, convert --dtype, ...),
as the name of its torch dtype: the schemas check names without importing torch (core/precision.py maps them)."""

DTYPE_NAMES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
               "fp16": "float16", "float16": "float16"}
