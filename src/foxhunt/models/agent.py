"""What the reinforcement-learning agents (DQN, PPO) share: the env plumbing, the greedy
evaluation pass, positions for the backtest, and the MLP builder.

:class:`TradingAgent` is the LightningModule base of both agents. An agent steps its vectorized
:class:`foxhunt.trading.env.TradingEnv` inside ``training_step`` (never in DataLoader workers);
the datamodule (:class:`foxhunt.data.datamodules.EnvDataModule`) only supplies the environments
(``make_env(split, num_envs, seed)`` for training, ``make_eval_env(split)`` for the costs of
the greedy walk) and a dummy batch per training step. The base:

- builds the training env in ``setup("fit")`` from ``self.trainer.datamodule`` and checks that
  the network input ``state_dim + 1`` (the features, then the position) matches
  ``env.observation_dim``;
- evaluates greedily over a whole split in validation and test: logs ``val/mean_reward``
  (mean reward per step, in ticks, net of costs) and ``val/env_pnl_usd`` (``test/...`` in
  test): the agent's own greedy walk through the env over the whole split, in Lightning's
  evaluation loop; the shared backtest's ``test/pnl`` is another figure (same formula, but over
  the scored bars, ``evaluation.max_bars``), hence the distinct name;
- implements ``trading_positions(datamodule, split)`` for the shared backtest;
- tracks episode returns for ``train/episode_reward`` and the env throughput, and decides
  which training steps log (``log_due``: the steps a logger or a callback can see).

The greedy pass is a sequential walk: flat at bar 0, then at every bar ``t`` the agent sees
the features of ``t`` and the position it holds, and its greedy action sets the position held
from ``t`` to ``t + 1``. Because the observation depends on the previous action, the walk is
inherently sequential; but the position takes only three values, so the network is evaluated
once, batched, on every bar for each of the three possible positions (a ``(T, 3)`` table of
greedy actions) and the walk itself is a cheap loop over integers. This gives exactly the
positions a step-by-step walk of ``TradingEnv.sequential`` would produce, at the cost of three
batched forward passes instead of ``T`` tiny ones. The last bar holds position 0 (no decision
is evaluated there). Rewards of the walk are :func:`foxhunt.trading.pnl.walk_pnl`'s, the env's
formula, with the commission and slippage of the env the datamodule builds for that split.

Each agent implements ``greedy_action(obs) -> LongTensor`` (argmax of its Q-values or policy
logits) and its own ``training_step`` / ``configure_optimizers``.

The hyperparameters both agents take are defined once here (:class:`AgentHyperparameters`);
each agent's definition inherits them (:mod:`foxhunt.config.model_schemas`).
"""

from __future__ import annotations

import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import torch
from lightning import LightningModule
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from pydantic import Field
from torch import Tensor, nn
from torch.nn.modules.module import (
    _global_backward_hooks,
    _global_backward_pre_hooks,
    _global_forward_hooks,
    _global_forward_pre_hooks,
)
from torch.optim import optimizer as torch_optimizer_module
from torch.utils._foreach_utils import _has_foreach_support

from foxhunt.assets import AssetSpec
from foxhunt.config.model_schemas import MAX_SEED, MAX_WIDTH, Hyperparameters
from foxhunt.trading.env import NUM_ACTIONS, TradingEnv
from foxhunt.trading.pnl import contract_costs, in_ticks, walk_pnl

#: The hidden activations of :func:`build_mlp` (config key ``model.module.activation``).
Activation = Literal["relu", "tanh", "gelu", "silu", "elu"]
ACTIVATIONS: dict[Activation, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "elu": nn.ELU,
}
#: Positions an agent can hold, in action order (action = position + 1).
POSITIONS = (-1, 0, 1)
#: The checkpoint key of an agent's training state (:meth:`TradingAgent.on_save_checkpoint`).
AGENT_STATE_KEY = "foxhunt_agent_state"
#: Bars evaluated per batched forward pass in the greedy walk (bounds its memory, not a tunable
#: of the model: the result does not depend on it).
GREEDY_CHUNK_BARS = 32768
#: ``model.module.compile_step``: ``always`` / ``never`` run the agent's gradient-step loss (its
#: forward, loss and, through AOTAutograd, backward) through torch.compile; ``auto`` does where it
#: measured faster for the family on the fit's device and the fit plans enough gradient steps to
#: pay its compile time back (the agent's ``compile_pays_after``).
CompileStep = Literal["auto", "always", "never"]
#: torch.compile's mode per device type: CUDA graphs on a GPU, where an agent's step is many small
#: kernel launches (LeanRL's recipe); inductor's default elsewhere.
COMPILE_MODES: dict[str, str] = {"cuda": "reduce-overhead"}


@functools.cache
def compiled(function: Callable[..., Any], device_type: str) -> Callable[..., Any]:
    """``function`` through torch.compile in the mode of ``device_type`` (:data:`COMPILE_MODES`):
    one compiled function per function and device type in the process. The agents' loss functions
    take their networks as arguments, so every agent of the same structure and sizes reuses the
    graphs compiled once (a new agent is no recompilation: dynamo's recompile limit is per
    function)."""
    return torch.compile(function, mode=COMPILE_MODES.get(device_type))


#: torch's ``clip_grad_norm_`` constants: the epsilon added to the total norm, and the relative
#: margin below ``max_norm`` under which its float32 clipping coefficient rounds to exactly 1 (two
#: float32 roundings, each within 6e-8 relative, sit well inside it): :meth:`TradingAgent.clip_grad_norm`.
_CLIP_EPS = 1e-6
_CLIP_MARGIN = 1e-6
#: The hooks Lightning's optimizer wrapper and ``manual_backward`` call around an update; a direct
#: update (:func:`direct_updates_allowed`) is taken only where no callback listens to them.
UPDATE_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")
#: What a precision plugin does around an update: a direct update is taken only where these are
#: Lightning's plain ones (no loss scaling, no closure of its own), as they are for 32-true,
#: bf16-mixed, bf16-true and foxhunt's policy plugins; 16-mixed's grad scaler is not.
_PLUGIN_UPDATE_METHODS = ("pre_backward", "backward", "post_backward", "optimizer_step", "_wrap_closure", "_after_closure")


def direct_updates_allowed(trainer: Any, module: LightningModule) -> bool:
    """Whether an agent's manual updates may skip Lightning's optimizer wrapper and
    ``manual_backward`` (:meth:`TradingAgent.update`) with the same result: one device, no grad
    scaler or other precision logic around backward and step (see ``_PLUGIN_UPDATE_METHODS``), no
    profiler, no callback hooked on :data:`UPDATE_HOOKS` and a module that overrides neither
    ``backward`` nor the backward hooks (its ``on_before_optimizer_step`` clipping is what
    :meth:`TradingAgent.clip_update_gradients` does in either path)."""
    if type(trainer.strategy) is not SingleDeviceStrategy or not isinstance(trainer.profiler, PassThroughProfiler):
        return False
    plugin = trainer.precision_plugin
    if getattr(plugin, "scaler", None) is not None:
        return False
    for name in _PLUGIN_UPDATE_METHODS:
        if getattr(type(plugin), name) not in (getattr(Precision, name), getattr(MixedPrecision, name)):
            return False
    if any(is_overridden(hook, callback, Callback) for callback in trainer.callbacks for hook in UPDATE_HOOKS):
        return False
    return not any(
        is_overridden(hook, module, LightningModule) for hook in ("backward", "on_before_backward", "on_after_backward")
    )


#: torch's fused Adam kernels by the ``decoupled_weight_decay`` of a group (AdamW's: True).
_FUSED_ADAM_KERNELS = {False: torch._fused_adam_, True: torch._fused_adamw_}


def step_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``, bit for bit, with less around it where it can: for torch's fused
    Adam or AdamW (:func:`foxhunt.precision.optim.make_optimizer`'s choice) on the CPU, every
    parameter with a gradient already holding its state (stepped once), no step hook and no LR
    scheduler wrapping the step, each group's parameters are stepped as torch's fused path steps
    them, its step counts incremented and its fused kernel called on them, without
    ``Optimizer.step``'s wrapper, ``_init_group`` and the grouping by device and dtype (on an
    agent's six small tensors these cost more than the kernel: docs/benchmarks.md, issue 41).
    Anything else: ``optimizer.step()`` itself."""
    groups = _fused_adam_groups(optimizer)
    if groups is None:
        optimizer.step()
        return
    with torch.no_grad():
        for group, params, grads, exp_avgs, exp_avg_sqs, steps in groups:
            beta1, beta2 = group["betas"]
            torch._foreach_add_(steps, 1)
            # AdamW: a class of its own in older torch (no such group key), Adam with decoupled_weight_decay in newer
            decoupled = type(optimizer) is torch.optim.AdamW or bool(group.get("decoupled_weight_decay", False))
            _FUSED_ADAM_KERNELS[decoupled](
                params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"], beta1=beta1,
                beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                grad_scale=None, found_inf=None,
            )  # fmt: skip


def _fused_adam_groups(optimizer: torch.optim.Optimizer) -> list[tuple[Any, ...]] | None:
    """Per param group: the group, its parameters with gradients, their gradients, both moments
    and step counts, where :func:`step_optimizer` may call the fused kernel itself; else None."""
    if (
        type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW)
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or torch_optimizer_module._global_optimizer_pre_hooks
        or torch_optimizer_module._global_optimizer_post_hooks
        or hasattr(optimizer.step, "_wrapped_by_lr_sched")
    ):
        return None
    groups = []
    for group in optimizer.param_groups:
        if not group.get("fused") or group["amsgrad"] or group["maximize"] or group["capturable"] or group["differentiable"]:
            return None
        if not isinstance(group["lr"], float) or isinstance(group["betas"][0], Tensor) or isinstance(group["betas"][1], Tensor):
            return None
        params = [p for p in group["params"] if p.grad is not None]
        states = [state for p in params if (state := optimizer.state.get(p))]
        if not params or len(states) != len(params) or any("step" not in state for state in states):
            return None
        first = params[0]
        for p in params:
            if p.device.type != "cpu" or p.dtype != first.dtype or p.grad.dtype != p.dtype or p.grad.is_sparse or p.is_complex():
                return None
        groups.append((group, params, [p.grad for p in params], [state["exp_avg"] for state in states],
                       [state["exp_avg_sq"] for state in states], [state["step"] for state in states]))  # fmt: skip
    return groups


def clear_gradients(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.zero_grad()`` (``set_to_none=True``, torch's default): every parameter's
    ``grad`` set to None, without the wrapper that keeps dynamo out of ``zero_grad`` and its
    profiler range, which cost more than clearing an agent's six tensors (docs/benchmarks.md,
    issue 41)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None


class MLP(nn.Sequential):
    """The agents' networks: an ``nn.Sequential`` (same layers, state-dict keys and hooks) whose
    forward calls each layer's ``forward`` itself where no hook could observe the difference:
    torch's ``Module.__call__`` takes the same shortcut when a module has no hooks, after two
    Python frames per layer (20 layer calls in a DQN agent step: four forwards of five layers;
    docs/benchmarks.md, issue 41). With any module or global hook, or under the TorchScript
    tracer, the layers are called as modules."""

    def forward(self, x: Tensor) -> Tensor:
        layers = self._modules.values()
        if _hooks_may_run(layers):
            return super().forward(x)
        for layer in layers:
            x = layer.forward(x)
        return x


def _hooks_may_run(layers: Iterable[nn.Module | None]) -> bool:
    """Whether calling ``layers`` as modules could run more than their ``forward``: what
    ``Module._call_impl`` checks before its own shortcut."""
    if (
        torch._C._get_tracing_state() is not None
        or _global_forward_hooks
        or _global_forward_pre_hooks
        or _global_backward_hooks
        or _global_backward_pre_hooks
    ):
        return True
    for layer in layers:  # a loop: any() over a generator costs a frame per layer
        if (
            layer is None
            or layer._forward_hooks
            or layer._forward_pre_hooks
            or layer._backward_hooks
            or layer._backward_pre_hooks
        ):
            return True
    return False


def build_mlp(input_dim: int, hidden_sizes: Sequence[int], output_dim: int, activation: Activation) -> MLP:
    """``Linear -> activation`` for each hidden size, then a final ``Linear`` to ``output_dim``.

    ``hidden_sizes`` may be empty (a linear model). The sizes and the activation are the agents'
    validated hyperparameters (:class:`AgentHyperparameters`): positive, one of :data:`ACTIVATIONS`.
    """
    sizes = [int(input_dim), *(int(h) for h in hidden_sizes), int(output_dim)]
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(ACTIVATIONS[activation]())
    return MLP(*layers)


def orthogonal_init_(mlp: nn.Sequential, hidden_gain: float, output_gain: float) -> nn.Sequential:
    """Orthogonal weights and zero biases, as in the PPO reference implementations: hidden
    layers with ``hidden_gain`` (sqrt(2)), the output layer with ``output_gain`` (0.01 for a
    policy head, 1.0 for a value head). Returns ``mlp``."""
    linears = [m for m in mlp if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        gain = output_gain if i == len(linears) - 1 else hidden_gain
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return mlp


def walk_positions(action_table: np.ndarray) -> np.ndarray:
    """Positions of the sequential greedy walk from a ``(T, 3)`` table of greedy actions.

    ``action_table[t, p + 1]`` is the action chosen at bar ``t`` while holding position ``p``.
    The walk starts flat; the position after bar ``t`` is ``action - 1``; the last bar gets 0.
    Returns int64 (T,) positions in {-1, 0, 1}.
    """
    table = np.asarray(action_table)
    num_bars = table.shape[0]
    positions = np.zeros(num_bars, dtype=np.int64)
    rows = table.tolist()  # a loop over Python ints is far faster than over numpy scalars
    position = 0
    for t in range(num_bars - 1):
        position = rows[t][position + 1] - 1
        positions[t] = position
    return positions


def walk_rewards(
    positions: np.ndarray,
    close: np.ndarray,
    asset: AssetSpec,
    commission_usd: float,
    slippage_ticks: float,
    roll_price: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-step reward (ticks) and PnL (USD) of holding ``positions[t]`` from bar t to t + 1, a walk
    that starts flat (the last position is ignored): :func:`foxhunt.trading.pnl.walk_pnl`'s net PnL
    at the asset's contract costs, and :func:`~foxhunt.trading.pnl.in_ticks` of it: the env's
    ``pnl_usd`` step by step, exactly (its reward is these ticks in float32). Returns two float64
    (T - 1,) arrays."""
    cost_per_contract = contract_costs(asset, commission_usd, slippage_ticks).per_contract_usd
    pnl_usd = walk_pnl(positions, close, roll_price, asset.multiplier, cost_per_contract).net
    return in_ticks(pnl_usd, asset.tick_value), pnl_usd


class AgentHyperparameters(Hyperparameters):
    """What both agents take (``model.module.*`` of conf/model/dqn.yaml and ppo.yaml).

    ``gamma`` has one meaning for both, the discount of the return they estimate, and one range,
    [0, 1). The env never terminates an episode, it only truncates it (a time limit), and both
    agents bootstrap through a truncation (DQN's target from ``Q(final_obs)``, PPO's TD target from
    ``V(final_obs)``): the return never ends, so it, and the fixed point of their Bellman updates,
    exist only for gamma < 1 (at 1 the value of holding a position grows without bound). At 0 the
    target is the one-step reward: DQN's ``r``, PPO's advantage ``r - V(s)``.
    """

    state_dim: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="features per bar; the networks take state_dim + 1 inputs (the position held last)")]  # fmt: skip
    activation: Annotated[Activation, Field(description="hidden activation of the networks")]
    num_envs: Annotated[int, Field(ge=1, le=MAX_WIDTH, description="training envs, each stepped once per agent step (model.env.num_envs)")]  # fmt: skip
    seed: Annotated[int, Field(ge=0, le=MAX_SEED, description="seeds the training env's episode starts and the agent's own sampling")]  # fmt: skip
    gamma: Annotated[float, Field(ge=0, lt=1, description="discount factor of the return (< 1: the episodes never terminate)")]
    max_grad_norm: Annotated[Annotated[float, Field(gt=0, le=1e6)] | None,
                             Field(description="total-norm gradient clipping of each network (null: none)")]  # fmt: skip
    compile_step: Annotated[CompileStep, Field(description="torch.compile the gradient step's forward, loss and backward: always, never, or auto (where it measured faster for this agent on this device, in fits long enough to pay the compile time back)")]  # fmt: skip


class TradingAgent(LightningModule, ABC):
    """LightningModule base of the RL agents (see the module docstring). Its arguments are the
    agent's validated hyperparameters (:class:`AgentHyperparameters`: each agent's class is
    :func:`~foxhunt.config.model_schemas.defined_by` its own definition).

    Args:
        state_dim: features per bar (16); the networks take ``state_dim + 1`` inputs.
        num_envs: parallel training episodes (``model.env.num_envs``).
        seed: seeds the training env's episode starts and the agent's own sampling.
    """

    monitor_metric = "val/mean_reward"
    monitor_mode = "max"
    hyperparameters: ClassVar[type[AgentHyperparameters]]
    #: ``compile_step: auto`` compiles the agent's loss on a device type when the fit plans at least
    #: this many gradient steps (absent: never): what measurement chose for each agent, the compile
    #: time over the time the compiled step saves (the agent's module says where and how).
    compile_pays_after: ClassVar[dict[str, int]]

    def __init__(self, state_dim: int, num_envs: int, seed: int, compile_step: CompileStep) -> None:
        super().__init__()
        self.compile_step = compile_step
        self._compiled_step = False  # decided when a fit starts (compiles_on)
        self.state_dim = int(state_dim)
        self.obs_dim = self.state_dim + 1  # the features, then the position held
        self.num_envs = int(num_envs)
        self.seed = int(seed)
        self.train_env: TradingEnv | None = None
        self._obs: Tensor | None = None  # the training envs' current observation
        self._resumed: dict[str, Any] | None = None  # a checkpoint's agent state, put back when training starts
        self._eval_costs: dict[str, tuple[AssetSpec, float, float]] = {}
        self._episode_return: Tensor | None = None
        self._last_step_time: float | None = None
        # Training statistics gathered between two logged steps (see ``log_due``).
        self._pending_returns: list[Tensor] = []
        self._pending_env_steps = 0
        self._shown_return: tuple[int, float] | None = None  # (epoch, train/episode_reward last logged in it)
        self._direct_updates = False  # decided when a fit starts (direct_updates_allowed)

    # ---------------------------------------------------------------- what each agent defines
    @property
    @abstractmethod
    def acting_network(self) -> nn.Sequential:
        """The network whose argmax over actions is the greedy action (Q-network, policy)."""

    @abstractmethod
    def greedy_action(self, obs: Tensor) -> Tensor:
        """(B, state_dim + 1) float observations -> (B,) int64 greedy actions in {0, 1, 2}."""

    @abstractmethod
    def clip_update_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip the gradients of ``optimizer``'s parameters as the agent's ``max_grad_norm`` says,
        before its step (unscaled gradients: Lightning calls it from ``on_before_optimizer_step``)."""

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.clip_update_gradients(optimizer)

    # ------------------------------------------------------------------------- env plumbing
    def setup(self, stage: str) -> None:
        datamodule = self._datamodule()
        if stage == "fit":
            self.train_env = datamodule.make_env("train", num_envs=self.num_envs, seed=self.seed)
            self.check_observation_dim(self.train_env)
        splits = {"fit": ("val",), "validate": ("val",), "test": ("test",)}.get(stage, ())
        for split in splits:
            env = datamodule.make_eval_env(split)  # the sequential walk env: its costs
            self.check_observation_dim(env)
            self._eval_costs[split] = (env.asset, env.commission_usd, env.slippage_ticks)

    def training_env(self) -> TradingEnv:
        """The training envs: built by :meth:`setup` for a fit (a caller that steps the agent itself,
        as foxhunt.bench.rl, sets ``train_env``)."""
        if self.train_env is None:
            raise RuntimeError(f"{type(self).__name__}: no training env; setup('fit') builds it from the trainer's datamodule")
        return self.train_env

    def observation(self) -> Tensor:
        """The training envs' current observation: the agent's ``on_train_start`` resets the envs."""
        if self._obs is None:
            raise RuntimeError(f"{type(self).__name__}: no observation of the training envs; on_train_start resets them")
        return self._obs

    def check_observation_dim(self, env: TradingEnv) -> None:
        """Raise ValueError unless the env's observation is ``state_dim + 1`` wide."""
        if env.observation_dim != self.obs_dim:
            raise ValueError(
                f"model.module.state_dim={self.state_dim}: the networks take state_dim + 1 = "
                f"{self.obs_dim} inputs (features + position) but the env's observation_dim is "
                f"{env.observation_dim} ({env.observation_dim - 1} features); set state_dim to "
                f"the dataset's feature count"
            )

    def _datamodule(self) -> Any:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if datamodule is None or not hasattr(datamodule, "make_env"):
            raise RuntimeError(
                f"{type(self).__name__}: the trainer has no datamodule with make_env(); pass "
                f"an EnvDataModule, e.g. trainer.fit(agent, datamodule=EnvDataModule(...))"
            )
        return datamodule

    @staticmethod
    def clip_grad_norm(params: Iterable[Tensor], max_norm: float | None) -> None:
        """Clip the gradients of ``params`` to total norm ``max_norm`` (None: no clipping): torch's
        ``clip_grad_norm_``, bit for bit. Called where Lightning has already unscaled the gradients
        under a grad scaler (``configure_gradient_clipping``, ``on_before_optimizer_step``);
        Lightning's own ``clip_gradients`` wrapper costs about as much again as the clipping itself
        (measured around each call in a PPO update; figures in docs/benchmarks.md).

        On the CPU, with every gradient of one dtype and of a type torch's foreach kernels take,
        the same ops are run without torch's grouping by device and dtype, and the scaling is
        skipped where the norm is below ``max_norm`` by a margin that makes torch's float32
        coefficient ``min(max_norm / (norm + 1e-6), 1)`` exactly 1 (a multiply by 1 changes no
        bit): on an agent's small networks every op is a few microseconds of dispatch, and the
        norm is read on the CPU without a device synchronization. Elsewhere torch's function."""
        if max_norm is None:
            return
        with_grads = [p for p in params if p.grad is not None]
        grads = [p.grad for p in with_grads if p.grad is not None]  # (the same, typed)
        if not grads:
            return
        first = grads[0]
        if (
            first.device.type != "cpu"
            or any(g.device != first.device or g.dtype != first.dtype for g in grads)
            or not _has_foreach_support(grads, first.device)
        ):
            torch.nn.utils.clip_grad_norm_(with_grads, max_norm)
            return
        with torch.no_grad():
            total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
            if float(total) + _CLIP_EPS <= max_norm * (1.0 - _CLIP_MARGIN):  # coefficient exactly 1: no change
                return
            torch._foreach_mul_(grads, torch.clamp(max_norm / (total + _CLIP_EPS), max=1.0))

    def compiles_on(self, device_type: str, planned_updates: float) -> bool:
        """Whether a fit on ``device_type`` of ``planned_updates`` gradient steps runs the compiled
        loss (``compile_step``; auto: :attr:`compile_pays_after`)."""
        if self.compile_step == "auto":
            pays_after = self.compile_pays_after.get(device_type)
            return pays_after is not None and planned_updates >= pays_after
        return self.compile_step == "always"

    @abstractmethod
    def updates_per_batch(self) -> int:
        """Gradient steps of one ``training_step`` (the most: fewer where ``max_steps`` cuts it)."""

    def planned_updates(self) -> float:
        """Gradient steps the trainer's fit plans: ``max_steps``, or ``max_epochs`` of its training
        batches (``inf`` when neither bounds it; 0 outside a fit)."""
        trainer = self._trainer
        if trainer is None:
            return 0.0
        by_steps = trainer.max_steps if trainer.max_steps is not None and trainer.max_steps >= 0 else float("inf")
        epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else float("inf")
        return min(by_steps, epochs * float(trainer.num_training_batches) * self.updates_per_batch())

    def step_function(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` (a loss taking the networks as arguments) as this fit runs it: compiled
        (:func:`compiled`) where :meth:`compiles_on` the module's device, else itself. Under CUDA
        graphs each call starts a new graph step: the previous call's outputs are not read again."""
        if not self._compiled_step:
            return function
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(function, self.device.type)

    def update(self, optimizer: Any, loss: Tensor | None) -> None:
        """One optimizer step of ``loss``'s gradients (None: a step without gradients, which Adam
        takes as no change), clipped first, counted in ``trainer.global_step``.

        Through Lightning's wrapper (``optimizer``, a LightningOptimizer: ``manual_backward``, then
        ``step``, its hooks and closure around the clipping of ``on_before_optimizer_step``) where
        something listens to it or changes it (a grad scaler: see :func:`direct_updates_allowed`),
        else directly: ``loss.backward()``, :meth:`clip_update_gradients` and the torch optimizer's
        ``step``, counted in the manual-optimization loop's ``optim_step_progress`` exactly as the
        wrapper counts it (ready, then completed: ``trainer.global_step`` is its completed total),
        so global_step, max_steps, logging and checkpoint cadence and resume are the same. The
        wrapper costs a quarter to a half of a DQN gradient step (foxhunt.bench.rl's framework
        share, docs/benchmarks.md); the updates are the same
        bit for bit (tests/models/test_agent_updates.py).
        """
        if not self._direct_updates:
            optimizer.zero_grad()
            if loss is not None:
                self.manual_backward(loss)
            optimizer.step()  # clipped first, in on_before_optimizer_step
            return
        torch_optimizer = optimizer.optimizer
        clear_gradients(torch_optimizer)
        if loss is not None:
            loss.backward()
            self.clip_update_gradients(torch_optimizer)
        progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        progress.increment_ready()
        step_optimizer(torch_optimizer)
        progress.increment_completed()

    def env_obs(self, obs: Tensor) -> Tensor:
        """An env observation as network input: on the module's device, float32."""
        return obs.to(device=self.device, dtype=torch.float32)

    def track_episodes(self, reward: Tensor, done: Tensor) -> Tensor | None:
        """Accumulate per-env returns; returns the returns of the episodes that just ended
        (on the env's device), or None when none did."""
        if self._episode_return is None or self._episode_return.shape != reward.shape:
            self._episode_return = torch.zeros_like(reward, dtype=torch.float32)
        self._episode_return += reward.to(torch.float32)
        if not bool(done.any()):
            return None
        finished = self._episode_return[done].clone()
        self._episode_return[done] = 0.0
        return finished

    def env_steps_per_s(self, env_steps: int) -> float | None:
        """Env steps per second since the previous call (or since training started; whole
        training loop iterations, learning included); None when no time has passed."""
        now = time.perf_counter()
        rate = None
        if self._last_step_time is not None and now > self._last_step_time:
            rate = env_steps / (now - self._last_step_time)
        self._last_step_time = now
        return rate

    def note_step(self, env_steps: int, finished_returns: Tensor | None) -> None:
        """Record a training step's env steps and the returns of the episodes it finished,
        for the next logged step."""
        self._pending_env_steps += int(env_steps)
        if finished_returns is not None and finished_returns.numel():
            self._pending_returns.append(finished_returns)

    def log_due(self, batch_idx: int, optimizer_steps: int) -> bool:
        """Whether this training step logs its metrics.

        ``self.log`` costs about as much as a DQN gradient step (Lightning moves its result
        collection to the value's device on every call; foxhunt.bench.rl measures it), so the
        agents log only where a value can be seen: the steps the trainer writes to its loggers
        (every ``trainer.log_every_n_steps``, Lightning's own test), the last step of an epoch
        and the step that reaches ``trainer.max_steps`` (``optimizer_steps``: how many this
        training step takes), with statistics aggregated since the previous logged step.
        """
        trainer = self.trainer
        if getattr(getattr(trainer, "_logger_connector", None), "should_update_logs", True):
            return True
        if batch_idx + 1 >= trainer.num_training_batches:
            return True
        max_steps = trainer.max_steps
        return max_steps is not None and 0 <= max_steps <= self.global_step + optimizer_steps

    def pending_metrics(self) -> dict[str, float]:
        """``train/episode_reward`` (mean return of the episodes finished since the previous
        logged step, when any) and ``train/env_steps_per_s`` (over the same interval); resets
        both. Without a finished episode, the epoch's last ``train/episode_reward`` is logged
        again: what Lightning writes at every logged step from the value it keeps for the epoch,
        said here so that a fit resumed in the epoch (whose Lightning kept nothing) writes it too."""
        metrics: dict[str, float] = {}
        if self._pending_returns:
            metrics["train/episode_reward"] = float(torch.cat(self._pending_returns).mean())
            self._shown_return = (self.current_epoch, metrics["train/episode_reward"])
        elif self._shown_return is not None and self._shown_return[0] == self.current_epoch:
            metrics["train/episode_reward"] = self._shown_return[1]
        rate = self.env_steps_per_s(self._pending_env_steps)
        if rate is not None:
            metrics["train/env_steps_per_s"] = rate
        self._pending_returns = []
        self._pending_env_steps = 0
        return metrics

    def on_train_start(self) -> None:
        """A fresh fit's statistics; a resumed fit's whole agent state, put back from its
        checkpoint (:meth:`on_load_checkpoint`) after the agent built its fresh state."""
        self._episode_return = None
        self._last_step_time = time.perf_counter()
        self._pending_returns = []
        self._pending_env_steps = 0
        self._shown_return = None
        trainer = self._trainer
        self._direct_updates = trainer is not None and direct_updates_allowed(trainer, self)
        self._compiled_step = self.compiles_on(self.device.type, self.planned_updates())
        saved, self._resumed = self._resumed, None
        if saved is None:
            return
        env = self.training_env()
        env.load_state_dict(saved["env"])
        self._obs = saved["obs"].to(env.device)
        returns = saved["episode_return"]
        self._episode_return = None if returns is None else returns.to(env.device)
        self._pending_returns = [r.to(env.device) for r in saved["pending_returns"]]
        self._pending_env_steps = int(saved["pending_env_steps"])
        shown = saved.get("shown_return")  # absent from checkpoints written before it was kept
        self._shown_return = None if shown is None else (int(shown[0]), float(shown[1]))
        self.restore_agent_state(saved)

    # ------------------------------------------------------------------------ exact resume
    def agent_state(self) -> dict[str, Any]:
        """What else the rest of a fit depends on, beyond the weights, the optimizers and the
        global random streams (each agent adds its own: a replay buffer, generators)."""
        return {}

    def restore_agent_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`agent_state` saved (called when a resumed fit starts)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint of a fit in progress holds the agent's whole training state: the envs
        (episodes and their generator), the observation, the episode returns and the statistics
        pending for the next logged step, and :meth:`agent_state` (plain tensors and numbers)."""
        if self._obs is None or self.train_env is None:
            return
        checkpoint[AGENT_STATE_KEY] = {
            "env": self.train_env.state_dict(), "obs": self._obs.detach().cpu().clone(),
            "episode_return": None if self._episode_return is None else self._episode_return.detach().cpu().clone(),
            "pending_returns": [r.detach().cpu().clone() for r in self._pending_returns],
            "pending_env_steps": self._pending_env_steps, "shown_return": self._shown_return, **self.agent_state(),
        }  # fmt: skip

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed = checkpoint.get(AGENT_STATE_KEY)

    # --------------------------------------------------------------------- greedy evaluation
    @torch.no_grad()
    def greedy_positions(self, features: np.ndarray | Tensor) -> np.ndarray:
        """(T,) int64 positions of the sequential greedy walk over ``features`` (T, state_dim)."""
        features_t = torch.as_tensor(features, dtype=torch.float32)
        if features_t.dim() != 2 or features_t.shape[1] != self.state_dim:
            raise ValueError(
                f"{type(self).__name__}.greedy_positions: features must be (T, "
                f"{self.state_dim}) (model.module.state_dim), got {tuple(features_t.shape)}"
            )
        was_training = self.training
        self.eval()
        try:
            tables = [
                self._action_table(features_t[start : start + GREEDY_CHUNK_BARS])
                for start in range(0, features_t.shape[0], GREEDY_CHUNK_BARS)
            ]
        finally:
            self.train(was_training)
        table = np.concatenate(tables) if tables else np.zeros((0, NUM_ACTIONS), np.int64)
        return walk_positions(table)

    def _action_table(self, features: Tensor) -> np.ndarray:
        """(C, 3) greedy actions of each bar for each position held (-1, 0, 1)."""
        chunk = features.to(self.device)
        obs = torch.cat([torch.cat([chunk, torch.full_like(chunk[:, :1], float(p))], dim=1) for p in POSITIONS])
        actions = self.greedy_action(obs).reshape(len(POSITIONS), chunk.shape[0])
        return actions.T.cpu().numpy().astype(np.int64)

    def trading_positions(self, datamodule: Any, split: str) -> np.ndarray:
        """(T,) positions in {-1, 0, 1} aligned with ``datamodule.dataset.splits[split].close``:
        the greedy walk over the split; the last bar holds 0."""
        arrays = datamodule.dataset.splits[split]
        return self.greedy_positions(arrays.features)

    def evaluate_split(self, split: str) -> dict[str, float]:
        """Greedy walk over a split of the trainer's datamodule: ``mean_reward`` (ticks per
        step) and ``env_pnl_usd`` (total, net of costs)."""
        if split not in self._eval_costs:
            raise RuntimeError(f"{type(self).__name__}.evaluate_split({split!r}): no env was built for this split in setup()")
        asset, commission_usd, slippage_ticks = self._eval_costs[split]
        datamodule = self._datamodule()
        positions = self.trading_positions(datamodule, split)
        arrays = datamodule.dataset.splits[split]
        reward, pnl_usd = walk_rewards(positions, arrays.close, asset, commission_usd, slippage_ticks, arrays.roll_price)
        return {"mean_reward": float(reward.mean()), "env_pnl_usd": float(pnl_usd.sum())}

    def _log_evaluation(self, split: str, prefix: str) -> None:
        metrics = self.evaluate_split(split)
        self.log(f"{prefix}/mean_reward", metrics["mean_reward"], prog_bar=True, batch_size=1)
        self.log(f"{prefix}/env_pnl_usd", metrics["env_pnl_usd"], batch_size=1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._log_evaluation("val", "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._log_evaluation("test", "test")
