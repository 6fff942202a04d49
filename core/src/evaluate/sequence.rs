//! The longest sequence that fits, beside the largest batch, and the sweep over sequence
//! lengths beside the sweep over batches.
//!
//! Both hold the typed batch per GPU (in as many accumulation passes as the global batch
//! needs) and vary the tokens of each sequence: the whole sequence in supervised training and
//! inference, the completion after a fixed prompt in DPO and GRPO. "Fits" is the largest
//! batch's criterion: the step's peak with the caching allocator's reserve (each length
//! replayed where the reserve is replayed), the CUDA context and the NCCL buffers, within the
//! GPU's capacity less the safety margin.

use super::{fit_verdict, resolve_reserve, step_at, sweep_row, Model, Parsed};
use crate::plan::bisect;
use crate::state::{PlanInputs, MAX_SEQ_LEN};
use crate::{FitVerdict, ObjectiveKind, SweepRow};

use super::Knobs;

/// The grid the search runs on: multiples of this many tokens (with context parallelism, of
/// a multiple of its group too, which must divide the sequence). 128 tokens is the block
/// that attention kernels and data loaders pad to, and it keeps the search to about 17
/// estimates on the longest grid (2^24 tokens).
pub const SEQ_STEP: u64 = 128;

/// Most lengths the search holds to their own allocator replay beyond the bisection's answer
/// (a gallop and a bisection over the whole grid take under 40).
const MAX_REFINE_REPLAYS: u32 = 40;

/// The longest sequence that fits at the typed batch ([`Scenario::longest_sequence`]).
///
/// [`Scenario::longest_sequence`]: crate::Scenario::longest_sequence
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongestSequence {
    /// The batch per GPU it holds: the typed one.
    pub batch: u64,
    /// Tokens of the longest sequence that fits (DPO and GRPO: of the completion), on the
    /// grid of [`step`](Self::step) or the model's own limit; `None` when not even `step`
    /// tokens fit.
    pub tokens: Option<u64>,
    /// DPO and GRPO: the prompt's tokens, held as typed (`tokens` are the completion's).
    pub prompt: Option<u64>,
    /// The grid's step in tokens.
    pub step: u64,
    /// The most positions the model takes (learned position embeddings: GPT-2, OPT, BERT),
    /// where it limits the search. Rotary models are not limited by their config's
    /// `max_position_embeddings`: long-context training runs past it (rope scaling).
    pub model_limit: Option<u64>,
}

impl LongestSequence {
    /// Tokens of the whole sequence at the answer (the prompt and the completion for DPO
    /// and GRPO).
    #[must_use]
    pub fn sequence_tokens(&self) -> Option<u64> {
        self.tokens
            .map(|t| t.saturating_add(self.prompt.unwrap_or(0)))
    }

    /// Whether the answer is the model's own limit, not the GPU's.
    #[must_use]
    pub fn at_model_limit(&self) -> bool {
        self.model_limit.is_some() && self.sequence_tokens() == self.model_limit
    }
}

/// Greatest common divisor.
const fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// What the searches share: the model, the plan with the typed step's reserve, the grid.
struct Search<'a> {
    parsed: &'a Parsed,
    knobs: Knobs,
    plan: PlanInputs,
    /// The typed batch.
    batch: u64,
    /// DPO and GRPO: the prompt (the completion varies).
    prompt: Option<u64>,
    /// The varied tokens as typed.
    typed: u64,
    /// The longest value the varied tokens may take.
    top: u64,
    /// The grid's step.
    step: u64,
    model_limit: Option<u64>,
}

impl<'a> Search<'a> {
    /// `None` where no sequence varies: the simple mode, an image model (its "sequence" is
    /// the image's side).
    fn new(plan: &PlanInputs, parsed: &'a Parsed, knobs: &Knobs) -> Option<Self> {
        let Parsed::Architecture(model) = parsed else {
            return None;
        };
        if model.arch.is_vision() {
            return None;
        }
        let (prompt, typed) = if knobs.objective.kind == ObjectiveKind::Sft {
            (None, knobs.seq_len)
        } else {
            (
                Some(knobs.objective.max_prompt),
                knobs.objective.max_completion,
            )
        };
        let model_limit = model.arch.max_positions();
        let whole = model_limit.map_or(MAX_SEQ_LEN, |m| m.min(MAX_SEQ_LEN));
        let top = whole.saturating_sub(prompt.unwrap_or(0));
        let cp = plan.context_parallel.max(1);
        let step = SEQ_STEP / gcd(SEQ_STEP, cp) * cp;
        let mut plan = *plan;
        let m = parsed.model(knobs);
        resolve_reserve(&mut plan, &m, knobs.batch);
        Some(Self {
            parsed,
            knobs: *knobs,
            plan,
            batch: knobs.batch,
            prompt,
            typed,
            top,
            step,
            model_limit,
        })
    }

    /// The step settings with `tokens` as the varied length.
    fn knobs_at(&self, tokens: u64) -> Knobs {
        let mut knobs = self.knobs;
        if self.prompt.is_some() {
            knobs.objective.max_completion = tokens;
        } else {
            knobs.seq_len = tokens;
        }
        knobs
    }

    /// The length of grid point `k` (1-based): `k` steps, the last point the top.
    fn tokens_at(&self, k: u64) -> u64 {
        k.saturating_mul(self.step).min(self.top)
    }

    /// Grid points in all.
    fn points(&self) -> u64 {
        self.top.div_ceil(self.step)
    }

    /// The verdict at `tokens` with the typed step's reserve (`own`: false) or with its own
    /// replay (`own`: true); `None` where the step cannot be estimated (too long to count,
    /// past what the model takes).
    fn verdict(&self, tokens: u64, own: bool) -> Option<FitVerdict> {
        let capacity = self.plan.capacity_bytes?;
        let knobs = self.knobs_at(tokens);
        let model = self.parsed.model(&knobs);
        let step = step_at(&model, &self.plan, self.batch).ok()?;
        let overheads = step.overheads(&self.plan.overheads);
        let fast = fit_verdict(step.peak_bytes, capacity, &overheads);
        if !own || !self.plan.replay_reserve {
            return Some(fast);
        }
        // a length that does not fit without any reserve needs no replay
        let bare = crate::Overheads {
            allocator_reserve_ppm: 0,
            ..overheads
        };
        let bare = fit_verdict(step.peak_bytes, capacity, &bare);
        if !bare.fits() {
            return Some(bare);
        }
        let mut plan = self.plan;
        resolve_reserve(&mut plan, &model, self.batch);
        let own = crate::Overheads {
            allocator_reserve_ppm: plan.overheads.allocator_reserve_ppm,
            ..overheads
        };
        Some(fit_verdict(step.peak_bytes, capacity, &own))
    }

    fn fits(&self, k: u64, own: bool) -> bool {
        self.verdict(self.tokens_at(k), own)
            .is_some_and(|v| v.fits())
    }

    /// The largest grid point that fits: a bisection with the typed step's reserve, then,
    /// where the reserve is replayed, the boundary found again from there by each point's own
    /// replay (a gallop away from the first answer and a bisection back), so that the answer
    /// fits by its own verdict and the next point does not. Peaks grow with the length, but
    /// nothing guarantees it: the answer is a boundary of the verdicts, the first the search
    /// meets. `None` when not even the first point fits.
    fn longest(&self) -> Option<u64> {
        let points = self.points();
        let first = bisect(0, points.saturating_add(1), |k| self.fits(k, false));
        if !self.plan.replay_reserve {
            return (first > 0).then_some(first);
        }
        let own = |k: u64| self.fits(k, true);
        let start = first.max(1);
        let left = std::cell::Cell::new(MAX_REFINE_REPLAYS);
        let probe = |k: u64| {
            left.set(left.get().saturating_sub(1));
            own(k)
        };
        let replays = || left.get() > 0;
        // (`good` fits by its own verdict, `bad` does not; 0 and `points + 1` stand for
        // "none" and "past the grid")
        let (mut good, mut bad) = if probe(start) {
            (start, points.saturating_add(1))
        } else {
            (0, start)
        };
        let mut step = 1u64;
        if good == start {
            while good < points && replays() {
                let next = good.saturating_add(step).min(points);
                if probe(next) {
                    good = next;
                    step = step.saturating_mul(2);
                } else {
                    bad = next;
                    break;
                }
            }
        } else {
            while bad > 1 && replays() {
                let next = bad.saturating_sub(step).max(1);
                if probe(next) {
                    good = next;
                    break;
                }
                bad = next;
                step = step.saturating_mul(2);
            }
        }
        while bad - good > 1 && replays() {
            let mid = good + (bad - good) / 2;
            if probe(mid) {
                good = mid;
            } else {
                bad = mid;
            }
        }
        (good > 0).then_some(good)
    }
}

/// The longest sequence that fits at the typed batch, `None` without a GPU or where no
/// sequence varies (the simple mode, an image model).
pub(crate) fn longest_sequence(
    plan: &PlanInputs,
    parsed: &Parsed,
    knobs: &Knobs,
) -> Option<LongestSequence> {
    plan.capacity_bytes?;
    let search = Search::new(plan, parsed, knobs)?;
    let tokens = search.longest().map(|k| search.tokens_at(k));
    Some(LongestSequence {
        batch: search.batch,
        tokens,
        prompt: search.prompt,
        step: search.step,
        model_limit: search.model_limit,
    })
}

/// The sweep over sequence lengths at the typed batch: powers of two around the typed
/// length and the typed length itself (DPO and GRPO: of the completion, after the prompt),
/// each row's [`SweepRow::tokens`] the whole sequence. A row fits when it is no longer than
/// `longest` (its search's answer, the same verdicts), or, off the grid less than a step
/// past it, by its own verdict; without a GPU the rows say nothing of fitting. Empty where
/// no sequence varies.
pub(crate) fn sequence_sweep(
    plan: &PlanInputs,
    parsed: &Parsed,
    knobs: &Knobs,
    longest: Option<&LongestSequence>,
) -> Vec<SweepRow> {
    let Some(search) = Search::new(plan, parsed, knobs) else {
        return Vec::new();
    };
    let longest = longest.and_then(|l| l.tokens).unwrap_or(0);
    crate::sweep(search.typed, search.top, |tokens| {
        let knobs = search.knobs_at(tokens);
        let model: Model = parsed.model(&knobs);
        step_at(&model, &search.plan, search.batch).map(|s| {
            // off the grid, within a step past the answer: its own verdict
            let fits = search.plan.capacity_bytes.map(|_| {
                tokens <= longest
                    || (tokens < longest.saturating_add(search.step)
                        && search.verdict(tokens, true).is_some_and(|v| v.fits()))
            });
            SweepRow {
                tokens: Some(tokens.saturating_add(search.prompt.unwrap_or(0))),
                ..sweep_row(search.batch, &s, fits)
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_query, encode_query, evaluate, parse_page, Scenario};

    fn scenario(query: &str) -> Scenario {
        Scenario::parse(&decode_query(query).state).expect("a scenario")
    }

    #[track_caller]
    fn longest(query: &str) -> LongestSequence {
        scenario(query)
            .longest_sequence()
            .unwrap_or_else(|| panic!("{query}: no search"))
    }

    /// Whether the page's own verdict at `tokens` (DPO and GRPO: completion tokens) fits.
    #[track_caller]
    fn fits_at(query: &str, tokens: u64) -> bool {
        let mut state = decode_query(query).state;
        if state.step.objective == ObjectiveKind::Sft {
            state.step.seq_len = tokens.to_string();
        } else {
            state.step.max_completion = tokens.to_string();
        }
        evaluate(&state)
            .ok()
            .and_then(|e| e.verdict)
            .is_some_and(|v| v.fits())
    }

    #[test]
    fn the_longest_sequence_fits_and_a_step_more_does_not() {
        for query in [
            "m=arch&model=llama3-8b&s=2048&b=1&r=amp-bf16&gc=full&method=qlora&o=paged-adamw8bit&gpu=rtx4090",
            "m=arch&model=llama3.2-1b&s=4096&b=2&r=bf16&gc=full&gpu=h100-80",
            "m=arch&model=qwen3-0.6b&s=2048&b=4&r=bf16&gpu=rtx4090&alloc=expandable",
            // gradient accumulation: the typed batch in its passes
            "m=arch&model=llama3.2-1b&s=1024&b=1&gb=8&r=bf16&gpu=rtx4090",
            // eager attention: the scores grow with the square of the length
            "m=arch&model=qwen3-0.6b&s=1024&b=2&r=bf16&attn=eager&gpu=rtx4090",
            // DPO: the completion after the typed prompt
            "m=arch&model=qwen3-0.6b&obj=dpo&b=1&mp=256&mc=512&r=bf16&gpu=rtx4090",
            // a typed reserve (not replayed)
            "m=arch&model=llama3.2-1b&s=2048&b=4&r=bf16&gpu=a100-40&res=8&alloc=default",
            // several GPUs: ZeRO-3
            "m=arch&model=llama3-8b&s=2048&b=1&r=bf16&gpu=h100-80&gpus=8&shard=zero3",
        ] {
            let l = longest(query);
            let tokens = l.tokens.unwrap_or_else(|| panic!("{query}: {l:?}"));
            assert_eq!(tokens % l.step, 0, "{query}: {l:?}");
            assert_eq!(l.batch, scenario(query).evaluate().unwrap().batch);
            assert!(fits_at(query, tokens), "{query}: {tokens} does not fit");
            assert!(
                !fits_at(query, tokens + l.step),
                "{query}: {tokens} + {} fits",
                l.step
            );
        }
    }

    #[track_caller]
    fn tokens(query: &str) -> Option<u64> {
        longest(query).tokens
    }

    #[test]
    fn a_larger_batch_fits_a_shorter_sequence() {
        for base in [
            "m=arch&model=llama3-8b&s=2048&r=amp-bf16&gc=full&method=qlora&o=paged-adamw8bit&gpu=rtx4090",
            "m=arch&model=llama3.2-1b&s=2048&r=bf16&gpu=h100-80",
        ] {
            let one = tokens(&format!("{base}&b=1")).unwrap();
            let four = tokens(&format!("{base}&b=4")).unwrap();
            assert!(four < one, "{base}: {four} at 4, {one} at 1");
            // about a quarter of the activations' room
            assert!(four * 2 < one, "{base}: {four} at 4, {one} at 1");
        }
    }

    #[test]
    fn where_nothing_fits_there_is_no_longest_sequence() {
        // a full fine-tune of 70B parameters on 24 GB: not even 128 tokens
        let l = longest("m=arch&model=llama3-70b&s=2048&b=1&r=bf16&gpu=rtx4090");
        assert_eq!(l.tokens, None);
        assert_eq!(l.sequence_tokens(), None);
        // no GPU, the simple mode, an image model: no search
        for query in [
            "m=arch&model=llama3-8b&s=2048&b=1&gpu=none",
            "p=7&pu=B&b=8&a=512&gpu=a100-80",
            "m=arch&model=vit-b16&s=224&b=8&gpu=a100-80",
        ] {
            assert_eq!(scenario(query).longest_sequence(), None, "{query}");
            if !query.contains("gpu=none") {
                assert!(scenario(query).sequence_sweep(None).is_empty(), "{query}");
            }
        }
    }

    #[test]
    fn learned_positions_cap_the_search() {
        // GPT-2 takes 1,024 positions: a GPU of 80 GB holds them all
        let l = longest("m=arch&model=gpt2&s=512&b=1&gpu=h100-80");
        assert_eq!(l.model_limit, Some(1024));
        assert_eq!(l.tokens, Some(1024));
        assert!(l.at_model_limit());
        // a rotary model is not capped by its trained context
        let l = longest("m=arch&model=llama3.2-1b&s=2048&b=1&r=bf16&gc=full&loss=cce&gpu=h100-80");
        assert_eq!(l.model_limit, None);
        assert!(l.tokens.unwrap() > 131_072, "{l:?}");
        assert!(!l.at_model_limit());
    }

    #[test]
    fn dpo_varies_the_completion_after_the_prompt() {
        let query = "m=arch&model=qwen3-0.6b&obj=dpo&b=1&mp=256&mc=512&r=bf16&gpu=rtx4090";
        let l = longest(query);
        assert_eq!(l.prompt, Some(256));
        let completion = l.tokens.unwrap();
        assert_eq!(l.sequence_tokens(), Some(256 + completion));
        let rows = scenario(query).sequence_sweep(Some(&l));
        let selected = rows.iter().find(|r| r.is_selected).unwrap();
        assert_eq!(selected.tokens, Some(256 + 512));
    }

    #[test]
    fn context_parallelism_searches_multiples_of_its_group() {
        let l = longest("m=arch&model=llama3.2-1b&s=3072&b=1&r=bf16&gpu=rtx4090&gpus=3&cp=3");
        assert_eq!(l.step, 384);
        assert_eq!(l.tokens.unwrap() % 384, 0);
    }

    #[test]
    fn the_sequence_sweep_holds_the_batch_and_agrees_with_the_search() {
        let query =
            "m=arch&model=llama3-8b&s=2000&b=1&r=amp-bf16&gc=full&method=qlora&o=paged-adamw8bit&gpu=rtx4090";
        let s = scenario(query);
        let l = s.longest_sequence().unwrap();
        let rows = s.sequence_sweep(Some(&l));
        let lengths: Vec<u64> = rows.iter().map(|r| r.tokens.unwrap()).collect();
        assert_eq!(
            lengths,
            [128, 256, 512, 1024, 2000, 2048, 4096, 8192],
            "{rows:?}"
        );
        let longest = l.tokens.unwrap();
        for row in &rows {
            assert_eq!(row.batch, 1);
            let tokens = row.tokens.unwrap();
            assert_eq!(row.fits, Some(tokens <= longest), "{row:?} vs {longest}");
            assert_eq!(row.fits, Some(fits_at(query, tokens)), "{row:?}");
            // each row is the page's step at that length
            let mut state = decode_query(query).state;
            state.step.seq_len = tokens.to_string();
            assert_eq!(
                row.total_bytes,
                evaluate(&state).unwrap().step.peak_bytes,
                "{row:?}"
            );
        }
        assert_eq!(rows.iter().filter(|r| r.is_selected).count(), 1);
        let table = crate::sweep_markdown(&rows, crate::ByteUnit::Gb);
        assert!(
            table.starts_with("| Sequence Length (tokens) | Weights + Grad + Opt at peak (GB) |"),
            "{table}"
        );
        assert!(table.contains("| **2000** |"), "{table}");
        // without a GPU the rows say nothing of fitting
        let free = scenario(&query.replace("gpu=rtx4090", "gpu=none"));
        let rows = free.sequence_sweep(None);
        assert_eq!(rows.len(), 8);
        assert!(rows.iter().all(|r| r.fits.is_none()));
    }

    #[test]
    fn the_sweep_axis_round_trips_through_the_url() {
        use crate::SweepAxis;
        let base = "m=arch&model=llama3-8b&s=4096&b=2&gpu=rtx4090";
        // the batch axis is the default, and stays out of links (older links unchanged)
        let d = decode_query(base);
        assert_eq!(d.state.sweep_axis, SweepAxis::Batch);
        assert!(!encode_query(&d.state).contains("sweep="));
        for axis in SweepAxis::ALL {
            let d = decode_query(&format!("{base}&sweep={}", axis.key()));
            assert!(d.notices.is_empty(), "{:?}", d.notices);
            assert_eq!(d.state.sweep_axis, axis);
            let query = encode_query(&d.state);
            let again = decode_query(&query);
            assert_eq!(again.state, d.state, "{query}");
            assert_eq!(query.contains("sweep=seq"), axis == SweepAxis::Seq);
            // with the other keys as they were
            assert_eq!(again.state.step.seq_len, "4096");
            assert_eq!(again.state.step.batch, "2");
        }
        // a bad value keeps the default, with a notice
        let d = decode_query(&format!("{base}&sweep=tokens"));
        assert_eq!(d.state.sweep_axis, SweepAxis::Batch);
        assert_eq!(d.notices.len(), 1, "{:?}", d.notices);
        // the axis changes no figure
        let page = |q: &str| parse_page(&decode_query(q).state).scenario;
        assert_eq!(page(base), page(&format!("{base}&sweep=seq")));
    }
}
