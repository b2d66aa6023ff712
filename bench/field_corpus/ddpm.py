"""diffusers: the DDPM training step of diffusers' unconditional image training script (a
``UNet2DModel``, ``DDPMScheduler.add_noise`` at uniformly drawn timesteps, the noise predicted
under a mean squared error, AdamW with ``get_scheduler("cosine")`` warm-up and gradient clipping at
1), on scikit-learn's digits upscaled to 16x16 and scaled to [-1, 1]. Healthy: the noise-prediction
loss falls."""

from __future__ import annotations

from .case import Health


def ddpm_digits():
    import torch
    import torch.nn.functional as F
    from diffusers import DDPMScheduler, UNet2DModel
    from diffusers.optimization import get_scheduler

    from gradwidget import Recorder

    from .data import digits

    torch.manual_seed(0)
    x, _, order = digits()
    images = F.interpolate(x.reshape(-1, 1, 8, 8), size=16, mode="bilinear") * 2 - 1
    model = UNet2DModel(
        sample_size=16,
        in_channels=1,
        out_channels=1,
        layers_per_block=1,
        block_out_channels=(16, 32),
        norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    )
    noise_scheduler = DDPMScheduler(num_train_timesteps=1000)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-6)
    steps, batch = 250, 32
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=25, num_training_steps=steps)
    losses = []
    with Recorder(model, optimizer) as rec:
        for step in range(steps):
            i = (step * batch) % (len(order) - batch)
            clean_images = images[order[i : i + batch]]
            noise = torch.randn(clean_images.shape)
            timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (batch,)).long()
            noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)
            model_output = model(noisy_images, timesteps).sample
            loss = F.mse_loss(model_output.float(), noise.float())
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            rec.log(loss=loss, lr=lr_scheduler.get_last_lr()[0])
            optimizer.step()
            lr_scheduler.step()
            losses.append(loss.item())
    before, after = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    return rec.run, Health("noise MSE (mean of 20 steps)", before, after, "after <= 0.5x before", after <= 0.5 * before)
