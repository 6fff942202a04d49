//! PyTorch's FSDP2 as it allocates on one rank, phase by phase, on top of the rank's tape.

use super::{accumulates, scale};
use crate::state::PlanInputs;
use crate::{
    Architecture, BackwardMoment, CategoryBytes, ParameterUnits, PeakEstimate, Peft, Phase,
    PrecisionRecipe, Reshard, ShardedState,
};

/// One FSDP2 rank: `fully_shard` on every layer and on the root, each parameter split on
/// its first dimension over the group (rank 0 holding the larger share of an uneven split).
/// What it holds beyond the tape was measured with PyTorch's own FSDP2 on a fake process
/// group (`validation/DISTRIBUTED.md`).
pub(crate) struct Fsdp2Rank {
    /// The sharded parameters, gradients and optimizer states.
    pub state: ShardedState,
    /// The root unit (embeddings, final norm, head) gathered: from its first forward to
    /// the end of backward (the root never reshards after forward). With the embeddings
    /// and the head as their own units (torchtune's `custom_sharded_layers`), the larger of
    /// them, which the loss and the end of backward hold gathered.
    root: u64,
    /// The largest layer gathered.
    layer: u64,
    /// Every layer gathered.
    layers: u64,
    /// What every layer keeps from its forward to its backward: nothing, all of it
    /// (`reshard_after_forward=False`) or its share of a smaller group (an int).
    kept: u64,
    /// One layer's gradients before their reduce-scatter: unsharded, then copied into the
    /// reduce-scatter input (in `reduce_dtype`).
    reduce: u64,
    /// The root's gradients on their way to its reduce-scatter, at the end of backward.
    root_reduce: u64,
    /// The largest layer's reduce-scatter input (in `reduce_dtype`).
    reduce_input: u64,
    /// Bytes per element of a gathered parameter and of the tape's gradients: the root's
    /// unsharded gradients are the tape's, in the gathered dtype.
    gathered: u64,
    tape_gradient: u64,
    /// The tape's gradients, all of them.
    tape_gradients: u64,
    reshard_after_forward: Reshard,
    /// The loss is computed outside the model's forward (and so outside the root unit).
    loss_outside: bool,
    /// `CPUOffloadPolicy`: the shards live in host RAM and the CPU steps them.
    offloaded: bool,
    /// Gradient accumulation: each micro-batch's reduce-scatter adds into the sharded
    /// gradients, which then live through the later micro-batches' forward and backward.
    accumulating: bool,
    /// Host RAM the offloaded shards take.
    pub host_bytes: u64,
    group: u64,
    /// [`Fsdp2Settings::own_units`].
    own_units: bool,
    /// Layers gathered in backward: the running one, and the next one when prefetched.
    backward_layers: u64,
    /// [`Fsdp2Settings::pipelined`]: the stage's unsharded gradients in `reduce_dtype`
    /// (held until the step's one reduction), 0 without a pipeline.
    pipeline_gradients: u64,
}

/// How FSDP2 wraps and runs the model, beside the tape and its units.
pub(crate) struct Fsdp2Settings {
    /// `reshard_after_forward` of the layers.
    pub reshard_after_forward: Reshard,
    /// The loss is computed outside the model's forward (and so outside the root unit).
    pub loss_outside: bool,
    /// `CPUOffloadPolicy`.
    pub offloaded: bool,
    /// The elements held gathered as the root: the root unit's, or with the embeddings
    /// and the head as their own units (torchtune's `custom_sharded_layers`) the larger.
    pub root_gathered: u64,
    /// The embeddings and the head are their own units: after the head's backward they
    /// reshard and reduce its gradient, so the layers' backward holds neither.
    pub own_units: bool,
    /// The next layer's all-gather is issued before this layer's gradients are computed
    /// (FSDP2 always; FSDP1 with `BACKWARD_PRE`): two layers gathered in backward.
    pub backward_prefetch: bool,
    /// torchao's float8 all-gather: the layers' linear weights are cast to float8 on each
    /// rank and gathered so, a byte per element (the scales travel as metadata; measured:
    /// `validation/FLOAT8.md`).
    pub float8_all_gather: bool,
    /// The rank runs a stage of torch's pipelining, which calls
    /// `set_requires_gradient_sync(False)` and `set_reshard_after_backward(False)` before
    /// every micro-batch's backward and reduces once, after the last
    /// (`torch/distributed/pipelining/stage.py`: `backward_maybe_with_nosync`,
    /// `perform_reduce_grad`; torch 2.15, as in torchtitan's December 2024 runs): the
    /// stage's gradients stay unsharded, cast to `reduce_dtype` as each unit's backward
    /// ends (`FSDPParamGroup._set_unsharded_grad_dtypes`) and accumulated in it, and a
    /// layer stays gathered after its backward (with `reshard_after_forward` until the next
    /// micro-batch's forward reshards it). Measured: `validation/pipeline.py --dp`.
    pub pipelined: bool,
}

impl Fsdp2Rank {
    /// The rank of a group of `group` GPUs for the tape `estimate` (one tensor-parallel
    /// rank's whole step) whose parameters are `units`, in the precision `recipe` names:
    /// the mixed recipes are FSDP2's `MixedPrecisionPolicy(param_dtype=bf16,
    /// reduce_dtype=fp32)` on fp32 parameters; the others keep the parameters' dtype.
    pub(crate) fn new(
        estimate: &PeakEstimate,
        units: &ParameterUnits,
        recipe: PrecisionRecipe,
        group: u64,
        settings: &Fsdp2Settings,
    ) -> Self {
        let &Fsdp2Settings {
            reshard_after_forward,
            loss_outside,
            offloaded,
            root_gathered,
            own_units,
            backward_prefetch,
            float8_all_gather,
            pipelined,
        } = settings;
        let group = group.max(1);
        // bytes per element: sharded (the optimizer's parameter), gathered (compute),
        // reduced
        let (sharded, gathered, reduced) = if recipe.master_weights() {
            (4, 2, 4)
        } else {
            let b = recipe.weight_bytes();
            (b, b, b)
        };
        let persistent = |bytes: fn(&CategoryBytes) -> u64| estimate.persistent(bytes);
        let shard = units.sharded_elements(group);
        // the same bytes per parameter as one GPU's state (the mixed recipes' fp32 master
        // is the sharded parameter itself), split over the group
        let whole = persistent(|c| c.parameters)
            .saturating_add(persistent(|c| c.gradients))
            .saturating_add(persistent(|c| c.optimizer_states));
        let elems = units.root.saturating_add(units.layers).max(1);
        let parameter_bytes = shard.saturating_mul(sharded);
        let gradient_bytes = parameter_bytes;
        // a padded shard carries its optimizer states at the same padding
        let optimizer_state_bytes = scale(whole, shard, elems)
            .saturating_sub(parameter_bytes.saturating_add(gradient_bytes));
        let shards = ShardedState {
            parameter_bytes,
            gradient_bytes,
            optimizer_state_bytes,
        };
        // offloaded, the GPU holds only what is gathered and reduced
        let (state, host_bytes) = if offloaded {
            (ShardedState::default(), shards.total())
        } else {
            (shards, 0)
        };
        // a layer gathered: its float8 linears' weights at a byte each with the float8
        // all-gather, the rest in the gathered dtype
        let gathered_bytes = |elements: u64, linears: u64| {
            if float8_all_gather {
                let linears = linears.min(elements);
                linears.saturating_add((elements - linears).saturating_mul(gathered))
            } else {
                elements.saturating_mul(gathered)
            }
        };
        let layers = gathered_bytes(units.layers, units.layers_linears);
        Fsdp2Rank {
            state,
            root: root_gathered.saturating_mul(gathered),
            layer: gathered_bytes(units.largest_layer, units.largest_layer_linears),
            layers,
            kept: reshard_after_forward.kept(layers),
            // a layer's gradients made (and, without a pipeline, copied into the
            // reduce-scatter input)
            reduce: units.largest_layer.saturating_mul(if pipelined {
                gathered
            } else {
                gathered.saturating_add(reduced)
            }),
            root_reduce: root_gathered.saturating_mul(gathered.saturating_add(reduced)),
            reduce_input: units.largest_layer.saturating_mul(reduced),
            gathered,
            tape_gradient: recipe.gradient_bytes().max(1),
            tape_gradients: persistent(|c| c.gradients),
            reshard_after_forward,
            loss_outside,
            offloaded,
            accumulating: accumulates(estimate),
            host_bytes,
            group,
            own_units,
            backward_layers: if backward_prefetch { 2 } else { 1 },
            pipeline_gradients: if pipelined {
                elems.saturating_mul(reduced)
            } else {
                0
            },
        }
    }

    /// The gradients alive before any layer's backward: from the second micro-batch of an
    /// accumulated step on, all the sharded ones (under a pipeline, the unsharded ones).
    fn accumulated(&self) -> u64 {
        match (self.accumulating, self.pipelined()) {
            (false, _) => 0,
            (true, true) => self.pipeline_gradients,
            (true, false) => self.state.gradient_bytes,
        }
    }

    /// The rank runs a pipeline stage ([`Fsdp2Settings::pipelined`]).
    fn pipelined(&self) -> bool {
        self.pipeline_gradients > 0
    }

    /// The gradients at a moment of the backward when the tape holds `tape` bytes of them:
    /// their share of the sharded gradients, or under a pipeline of the unsharded ones.
    fn backward_gradients(&self, tape: u64) -> u64 {
        let all = if self.pipelined() {
            self.pipeline_gradients
        } else {
            self.state.gradient_bytes
        };
        scale(all, tape, self.tape_gradients).min(all)
    }

    /// The gradients at the loss: a pipeline's unsharded ones made by the micro-batches
    /// before (GPipe's too), else the accumulated shards.
    fn loss_gradients(&self, c: &CategoryBytes) -> u64 {
        if self.pipelined() {
            self.backward_gradients(c.gradients)
        } else {
            self.accumulated()
        }
    }

    /// The layers gathered: every one without `reshard_after_forward`, else what they kept
    /// and the `running` ones.
    fn layers_gathered(&self, running: u64) -> u64 {
        match self.reshard_after_forward {
            Reshard::Off => self.layers,
            _ => self.kept.saturating_add(running),
        }
    }

    /// The tape's `bytes` of gradients in the gathered dtype.
    fn unsharded_gradients(&self, bytes: u64) -> u64 {
        scale(bytes, self.gathered, self.tape_gradient)
    }

    /// The rank's memory in the forward or the optimizer step, whose whole-rank tape
    /// figures are `c` (the backward is [`Fsdp2Rank::at_backward`]'s).
    pub(crate) fn at(&self, phase: Phase, c: &CategoryBytes) -> CategoryBytes {
        let s = &self.state;
        match phase {
            // a layer's gathered weights, and the previous layer's all-gather output that
            // stays referenced until the next copy-out (generation and scoring are
            // no-gradient forwards, gathered the same way)
            Phase::Forward | Phase::Generation | Phase::Scoring => CategoryBytes {
                parameters: s
                    .parameter_bytes
                    .saturating_add(self.root)
                    .saturating_add(self.layer)
                    .saturating_add(self.layers_gathered(self.layer)),
                gradients: self.accumulated(),
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            Phase::Backward => self.at_backward(BackwardMoment::Layers, c),
            // the optimizer steps the shards: its parameter-sized temporaries are shard-sized
            Phase::OptimizerStep => {
                let step = CategoryBytes {
                    parameters: s.parameter_bytes,
                    gradients: s.gradient_bytes,
                    optimizer_states: s.optimizer_state_bytes,
                    temporaries: if self.offloaded {
                        0
                    } else {
                        c.temporaries.div_ceil(self.group)
                    },
                    ..*c
                };
                // a pipeline's one reduction, before it: every layer gathered, every
                // unsharded gradient, the first unit's reduce-scatter input
                let reducing = CategoryBytes {
                    parameters: s
                        .parameter_bytes
                        .saturating_add(self.root)
                        .saturating_add(self.layers),
                    gradients: self.pipeline_gradients,
                    temporaries: self.reduce_input,
                    ..step
                };
                if self.pipelined() && total(&reducing) > total(&step) {
                    reducing
                } else {
                    step
                }
            }
        }
    }

    /// The rank's memory at the backward `moment`, whose whole-rank tape figures are `c`.
    pub(crate) fn at_backward(&self, moment: BackwardMoment, c: &CategoryBytes) -> CategoryBytes {
        let s = &self.state;
        let shards = s.parameter_bytes.saturating_add(self.root);
        match moment {
            // no layer has reduced yet. A loss inside the model's forward (transformers')
            // runs its backward after the root's pre-backward gathered the root (and the
            // last layer's all-gather output is still held); a loss outside it
            // (torchtitan's, which loss parallel implies) runs before
            // (under GPipe a later micro-batch's loss finds every layer gathered by the
            // backwards before it)
            BackwardMoment::Loss if self.loss_outside => CategoryBytes {
                parameters: s
                    .parameter_bytes
                    .saturating_add(match self.reshard_after_forward {
                        Reshard::Off => self.root.saturating_add(self.layers),
                        _ if self.pipelined() && !self.accumulating && c.gradients > 0 => {
                            self.root.saturating_add(self.layers)
                        }
                        _ => self.kept,
                    }),
                gradients: self.loss_gradients(c),
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            // (the last layer's all-gather output is the prefetched one: FSDP1 without
            // `BACKWARD_PRE` holds none yet)
            BackwardMoment::Loss => CategoryBytes {
                parameters: shards.saturating_add(
                    self.layers_gathered(self.layer.saturating_mul(self.backward_layers - 1)),
                ),
                gradients: self.loss_gradients(c),
                optimizer_states: s.optimizer_state_bytes,
                ..*c
            },
            // a layer's weights gathered again and (prefetched) the next one's, its
            // gradients on their way to the reduce-scatter; the layers behind it reduced
            // (their share of the tape's gradients, sharded)
            BackwardMoment::Layers => {
                // with their own units the head has resharded and its gradient (the
                // tape's, unsharded) is reduced before the layers' backward (measured:
                // validation/distributed.py --shard-embeddings)
                // (a pipeline's head neither reshards nor reduces there)
                let (root, head_gradient) = if self.own_units && !self.pipelined() {
                    (
                        self.root,
                        scale(self.root, self.tape_gradient, self.gathered),
                    )
                } else {
                    (0, 0)
                };
                // (a pipeline's layers stay gathered behind the running one: all of them
                // by the backward's end)
                let layers = if self.pipelined() {
                    self.layers
                } else {
                    self.layers_gathered(self.layer.saturating_mul(self.backward_layers))
                };
                CategoryBytes {
                    parameters: shards.saturating_sub(root).saturating_add(layers),
                    gradients: self.backward_gradients(c.gradients),
                    optimizer_states: s.optimizer_state_bytes,
                    temporaries: c
                        .temporaries
                        .saturating_sub(head_gradient)
                        .saturating_add(self.reduce),
                    ..*c
                }
            }
            // (under a pipeline nothing is resharded or reduced before the step's end)
            BackwardMoment::Embedding if self.pipelined() => CategoryBytes {
                parameters: shards.saturating_add(self.layers),
                gradients: self.pipeline_gradients,
                optimizer_states: s.optimizer_state_bytes,
                temporaries: self.unsharded_gradients(c.temporaries),
                ..*c
            },
            // the embeddings' gradients (the tape's, gathered dtype) made with the root
            // gathered; then the root reshards before its reduce-scatter input is filled
            // from the unsharded gradients (`FSDPParamGroup.post_backward`: `reshard()`
            // before `foreach_reduce`)
            BackwardMoment::Embedding => {
                let making = CategoryBytes {
                    parameters: shards,
                    gradients: s.gradient_bytes,
                    optimizer_states: s.optimizer_state_bytes,
                    temporaries: self.unsharded_gradients(c.temporaries),
                    ..*c
                };
                let reducing = CategoryBytes {
                    parameters: s.parameter_bytes,
                    temporaries: self.root_reduce,
                    ..making
                };
                if total(&reducing) > total(&making) {
                    reducing
                } else {
                    making
                }
            }
        }
    }
}

/// A moment's bytes, for comparing two moments.
fn total(c: &CategoryBytes) -> u64 {
    c.total().unwrap_or(u64::MAX)
}

/// The elements FSDP2 holds gathered as its root (the embeddings, the final norm and the
/// head), and whether the embeddings and the head are their own units (torchtune's
/// `custom_sharded_layers`): then one of the two, while it runs (a tied matrix is one).
pub(super) fn root_gathered(
    plan: &PlanInputs,
    arch: &Architecture,
    units: &ParameterUnits,
) -> (u64, bool) {
    let own_units = plan.shard_embeddings && !arch.tie_word_embeddings();
    let root = if own_units {
        units.root.div_ceil(2)
    } else {
        units.root
    };
    (root, own_units)
}

/// FSDP2 with LoRA or QLoRA (which no engine models moment by moment), beside the shards:
/// what is gathered in the forward and the backward, and what a mixed recipe's shards add.
/// - The root unit (embeddings, final norm, head) is gathered from the first forward to the
///   end of backward, as the engine has it (measured for LoRA: validation/distributed.py
///   --lora); without `reshard_after_forward` every layer stays gathered from its forward to
///   its backward too. A 4-bit base's root is not quantized: its elements in their own dtype
///   (fp32 after `prepare_model_for_kbit_training` or loaded so; derived).
/// - With the embeddings and the head as their own units, the head is gathered at the loss
///   and resharded before the layers' backward: the step holds it or a layer, not both
///   (measured: distributed.py --lora 16 --shard-embeddings 1).
/// - FSDP2's `MixedPrecisionPolicy` on a LoRA model loaded in fp32 (the mixed recipes) keeps
///   the frozen base's shards in fp32, gathered and computed in bf16; the tape counts the
///   base in bf16, so each shard holds as much again (measured: distributed.py --lora 16
///   --precision mixed-bf16).
#[derive(Clone, Copy, Default)]
pub(super) struct PeftAdditions {
    /// Gathered from the first forward to the end of backward.
    pub root: u64,
    /// The mixed recipe's fp32 shards beyond the tape's 16-bit base.
    pub fp32_shards: u64,
}

impl PeftAdditions {
    /// On one of `n` ranks, for `peft` in `recipe`; `whole_params` is the tape's parameter
    /// bytes, `gathered` the largest layer's share of them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        peft: &Peft,
        recipe: PrecisionRecipe,
        reshard_after_forward: Reshard,
        units: &ParameterUnits,
        whole_params: u64,
        root_gathered: u64,
        own_units: bool,
        gathered: u64,
        n: u64,
    ) -> Self {
        let rank_params = units.root.saturating_add(units.layers).max(1);
        let kept = reshard_after_forward.kept(units.layers);
        let held = if peft.quantized() {
            let bytes = if peft.kbit_prepare || peft.base_fp32 {
                4
            } else {
                recipe.weight_bytes()
            };
            let layers = whole_params.saturating_sub(units.root.saturating_mul(bytes));
            root_gathered
                .saturating_mul(bytes)
                .saturating_add(scale(layers, kept, units.layers))
        } else {
            scale(
                whole_params,
                root_gathered.saturating_add(kept),
                rank_params,
            )
        };
        let root = if own_units {
            held.saturating_sub(gathered)
        } else {
            held
        };
        let mixed = !peft.quantized() && !peft.base_fp32 && recipe.master_weights();
        PeftAdditions {
            root,
            fp32_shards: if mixed { whole_params.div_ceil(n) } else { 0 },
        }
    }
}
