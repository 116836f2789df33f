"""The nightly job and what it judges with: nights compared with the machine's drift taken out, the
noise band and change points, and the regression rules."""
