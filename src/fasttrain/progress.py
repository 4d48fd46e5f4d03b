"""Training progress for the main process: a tqdm bar on a terminal, plain periodic lines otherwise
(CI logs, `dvc queue logs`), where a bar's carriage returns would pile up as noise.

The loss arrives as a device tensor. Reading it waits for the GPU, so it is read only when the bar's
text or a line is due (every `refresh_seconds` / `line_seconds`), never once per step. That wait
also makes the images/s shown at that moment exact: everything queued before it has finished.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from tqdm import tqdm


class Progress:
    def __init__(self, name: str, epochs: int, steps_per_epoch: int, enabled: bool = True,
                 stream: TextIO | None = None, refresh_seconds: float = 1.0, line_seconds: float = 30.0,
                 clock: Callable[[], float] = time.perf_counter):
        self.name, self.epochs, self.steps_per_epoch = name, epochs, steps_per_epoch
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.bar_mode = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = refresh_seconds if self.bar_mode else line_seconds
        self.clock = clock
        self.bar: tqdm | None = None
        self.epoch = self.steps = self.images = 0
        self.epoch_start = self.last_shown = 0.0

    def start_epoch(self, epoch: int) -> None:
        """`epoch` counts from 0, as the training loop does."""
        if not self.enabled:
            return
        self.epoch, self.steps, self.images = epoch, 0, 0
        self.epoch_start = self.last_shown = self.clock()
        if self.bar_mode:
            self.bar = tqdm(total=self.steps_per_epoch, desc=f"{self.name} epoch {epoch + 1}/{self.epochs}",
                            unit="step", file=self.stream, leave=False, dynamic_ncols=True)

    def step(self, images: int, loss) -> None:
        """After each optimizer step: `images` in this process's batch, `loss` a (device) tensor."""
        if not self.enabled:
            return
        self.steps += 1
        self.images += images
        if self.bar is not None:
            self.bar.update(1)  # counts only: tqdm redraws at most every 0.1 s, reading no tensor
        if self.clock() - self.last_shown < self.interval:
            return
        loss_value = float(loss)  # the one host sync, once per interval
        self.last_shown = now = self.clock()
        images_per_second = self.images / max(now - self.epoch_start, 1e-9)
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss_value:.4f}, {images_per_second:,.0f} img/s")
        else:
            print(f"{self.name}: epoch {self.epoch + 1}/{self.epochs}  step {self.steps}/{self.steps_per_epoch}  "
                  f"loss {loss_value:.4f}  {images_per_second:,.0f} img/s  {now - self.epoch_start:.0f} s",
                  file=self.stream, flush=True)

    def end_epoch(self) -> None:
        """Clears the bar, so the epoch's summary line prints on a clean line."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
