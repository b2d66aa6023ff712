"""stable-baselines3 on gymnasium's classic-control tasks: ``model.learn()`` is the package's own
loop (rollouts, its losses, its optimizer steps); the Recorder watches ``model.policy`` and the
optimizer SB3 built for it. SB3 keeps its losses inside ``train()``, so no loss is logged: the run
holds the gradients the optimizer stepped with. Healthy: the mean reward of 10 deterministic
evaluation episodes afterwards is at least 100 and 3x the first 10 training episodes' (CartPole-v1
caps an episode at 500)."""

from __future__ import annotations

from .case import Health


def _reward(model, env) -> float:
    from stable_baselines3.common.evaluation import evaluate_policy

    mean, _ = evaluate_policy(model, env, n_eval_episodes=10, deterministic=True)
    return float(mean)


def _learn(model, env, timesteps: int):
    """Train under a Recorder; the Health: the first 10 training episodes' mean reward (the
    untrained, exploring policy) against 10 deterministic evaluation episodes afterwards."""
    from gradwidget import Recorder

    with Recorder(model.policy, model.policy.optimizer) as rec:
        model.learn(total_timesteps=timesteps)
    first = model.get_env().env_method("get_episode_rewards")[0][:10]  # SB3's Monitor wrapper keeps them
    return rec.run, float(sum(first) / len(first)), _reward(model, env)


def ppo_cartpole():
    import gymnasium as gym
    from stable_baselines3 import PPO

    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    model = PPO("MlpPolicy", env, n_steps=512, batch_size=64, n_epochs=4, seed=0, device="cpu")
    run, before, after = _learn(model, env, 10_000)
    return run, Health(
        "mean eval reward", before, after, "after >= 100 and >= 3x before", after >= 100 and after >= 3 * before
    )


def dqn_cartpole():
    import gymnasium as gym
    from stable_baselines3 import DQN

    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    # RL Baselines3 Zoo's tuned CartPole-v1 hyperparameters, with half its 128 gradient steps per update
    model = DQN(
        "MlpPolicy",
        env,
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=64,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs={"net_arch": [256, 256]},
        seed=0,
        device="cpu",
    )
    run, before, after = _learn(model, env, 20_000)
    return run, Health(
        "mean eval reward", before, after, "after >= 100 and >= 3x before", after >= 100 and after >= 3 * before
    )


def a2c_cartpole():
    """A2C with SB3's defaults (RMSprop at 7e-4, 5-step rollouts, so an update every 5 steps)."""
    import gymnasium as gym
    from stable_baselines3 import A2C

    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    model = A2C("MlpPolicy", env, seed=0, device="cpu")
    run, before, after = _learn(model, env, 25_000)
    return run, Health(
        "mean eval reward", before, after, "after >= 100 and >= 3x before", after >= 100 and after >= 3 * before
    )
