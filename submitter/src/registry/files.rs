//! The registry's file formats, parsed strictly: `model_config/<org>/<slug>.yaml` and
//! `model_config/_patterns.yaml`, exactly as the replaced system wrote them.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;

/// Declares a struct holding every serve field plus `$extra` fields, all strict.
/// serde's `flatten` does not combine with `deny_unknown_fields`, hence one macro for the field list.
macro_rules! with_serve_fields {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident : $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        $vis struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            pub tensor_parallel_size: Option<u32>,
            pub data_parallel_size: Option<u32>,
            /// Pipeline stages (docs/multinode.md); 1 when unset.
            pub pipeline_parallel_size: Option<u32>,
            /// Nodes the engine spans; unset = the fewest that hold TP × PP × DP.
            pub nodes: Option<u32>,
            pub max_model_len: Option<u64>,
            pub swap_space: Option<u32>,
            pub trust_remote_code: Option<bool>,
            pub tool_call_parser: Option<String>,
            pub reasoning_parser: Option<String>,
            /// JSON text, kept as written.
            pub hf_overrides: Option<String>,
            /// JSON text, kept as written.
            pub limit_mm_per_prompt: Option<String>,
            pub max_num_seqs: Option<u32>,
            pub max_output_tokens: Option<u64>,
            pub conda_env: Option<String>,
            pub agent_kwargs: Option<Vec<String>>,
            pub extra_args: Option<String>,
            pub timeout_multiplier: Option<f64>,
        }

        impl $name {
            /// Just the serve fields.
            #[allow(dead_code)] // the macro gives every struct this; not every one needs it
            pub(crate) fn serve_fields(&self) -> ServeFields {
                ServeFields {
                    tensor_parallel_size: self.tensor_parallel_size,
                    data_parallel_size: self.data_parallel_size,
                    pipeline_parallel_size: self.pipeline_parallel_size,
                    nodes: self.nodes,
                    max_model_len: self.max_model_len,
                    swap_space: self.swap_space,
                    trust_remote_code: self.trust_remote_code,
                    tool_call_parser: self.tool_call_parser.clone(),
                    reasoning_parser: self.reasoning_parser.clone(),
                    hf_overrides: self.hf_overrides.clone(),
                    limit_mm_per_prompt: self.limit_mm_per_prompt.clone(),
                    max_num_seqs: self.max_num_seqs,
                    max_output_tokens: self.max_output_tokens,
                    conda_env: self.conda_env.clone(),
                    agent_kwargs: self.agent_kwargs.clone(),
                    extra_args: self.extra_args.clone(),
                    timeout_multiplier: self.timeout_multiplier,
                }
            }
        }
    };
}

with_serve_fields! {
    /// The serve fields, as a variant block or the result of an overlay.
    pub struct ServeFields {}
}

with_serve_fields! {
    /// `model_config/<org>/<slug>.yaml`: base fields at the top level, `subsystems.eval` on top.
    pub(crate) struct ModelFile {
        /// The HF id; a file without it is skipped (the id never comes from the path).
        pub model: Option<String>,
        pub subsystems: Option<Subsystems>,
        /// Ignored, as in the replaced system.
        pub notes: Option<IgnoredAny>,
        /// A top-level `variants:` is ignored by the replaced system; kept accepted and ignored.
        pub variants: Option<IgnoredAny>,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Subsystems {
    pub eval: Option<EvalBlock>,
    /// Ignored (datagen settings are not ours).
    pub(crate) datagen: Option<IgnoredAny>,
}

with_serve_fields! {
    /// `subsystems.eval`: overlays the base key by key; `variants.<profile>` replace wholesale.
    pub(crate) struct EvalBlock {
        pub variants: Option<BTreeMap<String, VariantBlock>>,
    }
}

with_serve_fields! {
    /// One `variants.<profile>` block; a nested `variants:` is ignored as in the replaced system.
    pub(crate) struct VariantBlock {
        pub variants: Option<IgnoredAny>,
    }
}

/// `model_config/_patterns.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PatternsFile {
    pub patterns: Vec<PatternItem>,
}

with_serve_fields! {
    /// One pattern: a regex searched anywhere in the id, optional profile filter, serve fields.
    pub(crate) struct PatternItem {
        #[serde(rename = "match")]
        pub match_: String,
        pub profiles: Option<Vec<String>>,
        pub variants: Option<BTreeMap<String, VariantBlock>>,
    }
}

impl ServeFields {
    /// `self` overlaid key by key with `top` (top wins where it sets a key).
    pub(crate) fn overlaid_with(&self, top: &ServeFields) -> ServeFields {
        ServeFields {
            tensor_parallel_size: top.tensor_parallel_size.or(self.tensor_parallel_size),
            data_parallel_size: top.data_parallel_size.or(self.data_parallel_size),
            pipeline_parallel_size: top.pipeline_parallel_size.or(self.pipeline_parallel_size),
            nodes: top.nodes.or(self.nodes),
            max_model_len: top.max_model_len.or(self.max_model_len),
            swap_space: top.swap_space.or(self.swap_space),
            trust_remote_code: top.trust_remote_code.or(self.trust_remote_code),
            tool_call_parser: top.tool_call_parser.clone().or(self.tool_call_parser.clone()),
            reasoning_parser: top.reasoning_parser.clone().or(self.reasoning_parser.clone()),
            hf_overrides: top.hf_overrides.clone().or(self.hf_overrides.clone()),
            limit_mm_per_prompt: top.limit_mm_per_prompt.clone().or(self.limit_mm_per_prompt.clone()),
            max_num_seqs: top.max_num_seqs.or(self.max_num_seqs),
            max_output_tokens: top.max_output_tokens.or(self.max_output_tokens),
            conda_env: top.conda_env.clone().or(self.conda_env.clone()),
            agent_kwargs: top.agent_kwargs.clone().or(self.agent_kwargs.clone()),
            extra_args: top.extra_args.clone().or(self.extra_args.clone()),
            timeout_multiplier: top.timeout_multiplier.or(self.timeout_multiplier),
        }
    }

    /// Values no command may use, each naming the field and the fix. `registry check` lists them;
    /// `Registry::load` refuses a registry with any, so `spec`, `plan` and `launch` never use one.
    pub fn problems(&self) -> Vec<String> {
        use launch_spec::validate as v;
        let mut problems = Vec::new();
        for (name, value) in [("hf_overrides", &self.hf_overrides), ("limit_mm_per_prompt", &self.limit_mm_per_prompt)]
        {
            if let Some(text) = value
                && let Err(err) = serde_json::from_str::<serde_json::Value>(text)
            {
                problems.push(format!("{name} is not valid JSON ({err}): write it as a single-quoted JSON string"));
            }
        }
        for kwarg in self.agent_kwargs.iter().flatten() {
            if !kwarg.contains('=') {
                problems.push(format!("agent_kwargs item `{kwarg}` is not key=value"));
            }
        }
        if let Some(extra) = &self.extra_args
            && let Err(err) = shell_words::split(extra)
        {
            problems.push(format!("extra_args cannot be split into arguments: {err}"));
        }
        match (self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size) {
            (None, None, None) => {}
            (tp, pp, dp) => {
                if let Err(problem) = v::gpus(tp.unwrap_or(1), pp.unwrap_or(1), dp.unwrap_or(1)) {
                    problems.push(problem);
                }
            }
        }
        if let Some(nodes) = self.nodes
            && let Err(problem) = v::nodes(nodes)
        {
            problems.push(format!("nodes {problem}"));
        }
        if let Some(value) = self.timeout_multiplier
            && let Err(problem) = v::multiplier(value)
        {
            problems.push(format!("timeout_multiplier {problem}"));
        }
        for (name, value, max) in [
            ("max_model_len", self.max_model_len, v::MAX_TOKENS),
            ("max_output_tokens", self.max_output_tokens, v::MAX_TOKENS),
            ("max_num_seqs", self.max_num_seqs.map(u64::from), v::MAX_SEQS),
        ] {
            if let Some(value) = value
                && let Err(problem) = v::count_up_to(value, max)
            {
                problems.push(format!("{name} {problem}"));
            }
        }
        problems
    }

    /// The replaced system treats an entry with no fields as no entry.
    pub fn is_empty(&self) -> bool {
        *self == ServeFields::default()
    }
}
