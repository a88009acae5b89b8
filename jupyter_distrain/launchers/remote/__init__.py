"""What the remote launchers (ssh, Slurm, Ray) do alike, written once over their transports:
bringing back what a job produced on its hosts (:mod:`.bring_back`)."""
