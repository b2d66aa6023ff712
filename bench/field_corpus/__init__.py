"""The field corpus: healthy training written by others, beside the zoo. Each case runs a loop an
installed package ships (stable-baselines3, pyro, gpytorch, torch-geometric, diffusers, skorch,
pytorch-ignite, Lightning, transformers' Trainer), attached with the Recorder lines the README documents, on
data bundled with installed packages, and checks that it trained healthily (its ``Health``).
Every finding above Low on these runs is a false alarm. ``bench/diagnosis.py --field`` scores it;
a case whose package is missing is skipped with a message (``pip install ".[field]"``).

    from field_corpus import FIELD
    run, health = FIELD[0].train()
"""

from . import ddpm, gp, graph, hf_trainer, lightning_ae, pyro_vae, rl, trainers
from .case import FieldCase, Health
from .runner import FIELD_VERSION, health_of, load_or_run, run_case

FIELD: tuple[FieldCase, ...] = (
    FieldCase(
        "sb3-ppo-cartpole",
        "stable-baselines3",
        ("stable_baselines3", "gymnasium"),
        "PPO on CartPole-v1",
        rl.ppo_cartpole,
    ),
    FieldCase(
        "sb3-dqn-cartpole",
        "stable-baselines3",
        ("stable_baselines3", "gymnasium"),
        "DQN on CartPole-v1",
        rl.dqn_cartpole,
    ),
    FieldCase(
        "sb3-a2c-cartpole",
        "stable-baselines3",
        ("stable_baselines3", "gymnasium"),
        "A2C on CartPole-v1",
        rl.a2c_cartpole,
    ),
    FieldCase(
        "pyro-bayesian-regression-diabetes",
        "pyro-ppl",
        ("pyro",),
        "SVI with an AutoDiagonalNormal guide, Bayesian linear regression, diabetes",
        pyro_vae.bayesian_regression_diabetes,
    ),
    FieldCase("pyro-vae-digits", "pyro-ppl", ("pyro",), "SVI on a VAE's ELBO, digits", pyro_vae.vae_digits),
    FieldCase(
        "pyro-vae-digits-torch-adam",
        "pyro-ppl",
        ("pyro",),
        "Trace_ELBO.differentiable_loss with torch Adam, VAE on digits",
        pyro_vae.vae_digits_torch_optimizer,
    ),
    FieldCase(
        "gpytorch-exactgp-diabetes",
        "gpytorch",
        ("gpytorch",),
        "exact GP marginal likelihood, diabetes",
        gp.exact_gp_diabetes,
    ),
    FieldCase(
        "gpytorch-svgp-diabetes",
        "gpytorch",
        ("gpytorch",),
        "variational GP's ELBO over minibatches, diabetes",
        gp.svgp_diabetes,
    ),
    FieldCase(
        "pyg-gcn-digits",
        "torch-geometric",
        ("torch_geometric", "sklearn"),
        "GCN node classification, digits kNN graph",
        graph.gcn_digits,
    ),
    FieldCase(
        "pyg-gat-digits",
        "torch-geometric",
        ("torch_geometric", "sklearn"),
        "GAT node classification, digits kNN graph",
        graph.gat_digits,
    ),
    FieldCase(
        "pyg-gcn-karate",
        "torch-geometric",
        ("torch_geometric",),
        "GCN of PyG's introduction, karate club",
        graph.gcn_karate,
    ),
    FieldCase(
        "diffusers-ddpm-digits", "diffusers", ("diffusers",), "DDPM noise prediction, digits 16x16", ddpm.ddpm_digits
    ),
    FieldCase(
        "skorch-mlp-digits",
        "skorch",
        ("skorch", "sklearn"),
        "NeuralNetClassifier (softmax module, NLLLoss), digits",
        trainers.skorch_digits,
    ),
    FieldCase(
        "skorch-mlp-cancer-b8-plateau",
        "skorch",
        ("skorch", "sklearn"),
        "Pipeline(StandardScaler, net), batch 8, ReduceLROnPlateau, breast cancer",
        trainers.skorch_cancer_small_batch,
    ),
    FieldCase(
        "skorch-lbfgs-friedman",
        "skorch",
        ("skorch", "sklearn"),
        "NeuralNetRegressor with LBFGS, Friedman #1 without noise",
        trainers.skorch_lbfgs_regression,
    ),
    FieldCase(
        "skorch-regressor-diabetes-raw-targets",
        "skorch",
        ("skorch", "sklearn"),
        "NeuralNetRegressor, diabetes targets unscaled (25-346)",
        trainers.skorch_regressor_diabetes,
    ),
    FieldCase(
        "skorch-mlp-wine-converged",
        "skorch",
        ("skorch", "sklearn"),
        "Pipeline(StandardScaler, net), wine, trained to a training loss near 1e-5",
        trainers.skorch_wine_converged,
    ),
    FieldCase(
        "ignite-cnn-digits",
        "pytorch-ignite",
        ("ignite",),
        "create_supervised_trainer, CNN on digits",
        trainers.ignite_digits,
    ),
    FieldCase(
        "hf-trainer-gpt2-text",
        "transformers",
        ("transformers",),
        "Trainer, causal LM on Python's reference text",
        hf_trainer.gpt2_trainer_text,
    ),
    FieldCase(
        "hf-trainer-vit-digits",
        "transformers",
        ("transformers",),
        "Trainer, image classification with ViT on digits",
        hf_trainer.vit_trainer_digits,
    ),
    FieldCase(
        "lightning-autoencoder-digits",
        "lightning",
        ("lightning",),
        "Trainer.fit, the README's LitAutoEncoder on digits",
        lightning_ae.autoencoder_digits,
    ),
    FieldCase(
        "lightning-gan-digits",
        "lightning",
        ("lightning", "scipy"),
        "the basic GAN tutorial (two optimizers, manual optimization) on digits",
        lightning_ae.gan_digits,
    ),
)

__all__ = ["FIELD", "FIELD_VERSION", "FieldCase", "Health", "health_of", "load_or_run", "run_case"]
