"""Running on cluster schedulers: Slurm batch scripts (slurm.py) and Kubernetes manifests (k8s.py).

The schedulers start the processes (torchrun on each node); nothing here launches or supervises them.
"""
