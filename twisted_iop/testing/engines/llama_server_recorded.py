"""What the real llama-server answered (written by record_llama_server.py: do not edit).

llama.cpp build b1-0c1e570, the one vendored in llama-cpp-python 0.3.36, built by
``make llama-server``; re-record with ``python -m twisted_iop.testing.engines.record_llama_server``.
"""

#: llama-server's ``build_info`` (``/props``) when these were recorded.
BUILD = "b1-0c1e570"

#: Answer name -> (status, Content-Type, body).
RECORDED: dict[str, tuple[int, str, bytes]] = {
    "chat_while_loading": (
        503,
        "application/json; charset=utf-8",
        b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}',
    ),
    "context_length_exceeded": (
        400,
        "application/json; charset=utf-8",
        b'{"error":{"code":400,"message":"request (628 tokens) exceeds the available c'
        b'ontext size (512 tokens), try increasing it","type":"exceed_context_size_err'
        b'or","n_prompt_tokens":628,"n_ctx":512}}',
    ),
    "embeddings_not_supported": (
        501,
        "application/json; charset=utf-8",
        b'{"error":{"code":501,"message":"This server does not support embeddings. Sta'
        b'rt it with `--embeddings`","type":"not_supported_error"}}',
    ),
    "health_loading": (
        503,
        "application/json; charset=utf-8",
        b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}',
    ),
    "health_ok": (200, "application/json; charset=utf-8", b'{"status":"ok"}'),
    "invalid_request": (
        400,
        "application/json; charset=utf-8",
        b'{"error":{"code":400,"message":"\'messages\' is required","type":"invalid_request_error"}}',
    ),
    "metrics_busy": (
        200,
        "text/plain; version=0.0.4",
        b"# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached "
        b"tokens\n# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 58\n#"
        b" HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache\n"
        b"# TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_total 0"
        b"\n# HELP llamacpp:prompt_seconds_total Total time spent processing prompts\n# TYPE lla"
        b"macpp:prompt_seconds_total counter\nllamacpp:prompt_seconds_total 0.00539\n# HELP llam"
        b"acpp:tokens_predicted_total Number of generation tokens processed\n# TYPE llamacpp:tokens"
        b"_predicted_total counter\nllamacpp:tokens_predicted_total 0\n# HELP llamacpp:tokens_pr"
        b"edicted_seconds_total Total time spent generating tokens\n# TYPE llamacpp:tokens_predicte"
        b"d_seconds_total counter\nllamacpp:tokens_predicted_seconds_total 0\n# HELP llamacpp:n_"
        b"decode_total Total number of llama_decode() calls, excluding speculative decoding and mu"
        b"ltimodal decoding\n# TYPE llamacpp:n_decode_total counter\nllamacpp:n_decode_total 177"
        b"\n# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)"
        b"\n# TYPE llamacpp:n_tokens_max counter\nllamacpp:n_tokens_max 205\n# HELP llamacpp:spec"
        b"_decode_num_draft_tokens_total Speculative: Total draft tokens generated\n# TYPE llamacpp"
        b":spec_decode_num_draft_tokens_total counter\nllamacpp:spec_decode_num_draft_tokens_total "
        b"0\n# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens "
        b"accepted by the target model\n# TYPE llamacpp:spec_decode_num_accepted_tokens_total count"
        b"er\nllamacpp:spec_decode_num_accepted_tokens_total 0\n# HELP llamacpp:spec_decode_num_"
        b"drafts_total Speculative: Total speculative decoding verification steps\n# TYPE llamacpp:"
        b"spec_decode_num_drafts_total counter\nllamacpp:spec_decode_num_drafts_total 0\n# HELP "
        b"llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s\n# TYPE llamacpp:pro"
        b"mpt_tokens_seconds gauge\nllamacpp:prompt_tokens_seconds 9085.21\n# HELP llamacpp:pred"
        b"icted_tokens_seconds Average generation throughput in tokens/s\n# TYPE llamacpp:predicted"
        b"_tokens_seconds gauge\nllamacpp:predicted_tokens_seconds 0\n# HELP llamacpp:requests_p"
        b"rocessing Number of requests processing\n# TYPE llamacpp:requests_processing gauge\nll"
        b"amacpp:requests_processing 2\n# HELP llamacpp:requests_deferred Number of requests deferr"
        b"ed\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\n# HELP llama"
        b"cpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call\n# TYPE "
        b"llamacpp:n_busy_slots_per_decode gauge\nllamacpp:n_busy_slots_per_decode 1.99435\n",
    ),
    "metrics_idle": (
        200,
        "text/plain; version=0.0.4",
        b"# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached "
        b"tokens\n# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 0\n# "
        b"HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache\n#"
        b" TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_tota"
        b"l 0\n# HELP llamacpp:prompt_seconds_total Total time spent processing prompts\n# TYPE "
        b"llamacpp:prompt_seconds_total counter\nllamacpp:prompt_seconds_total 0\n# HELP llamacp"
        b"p:tokens_predicted_total Number of generation tokens processed\n# TYPE llamacpp:tokens_pr"
        b"edicted_total counter\nllamacpp:tokens_predicted_total 0\n# HELP llamacpp:tokens_predi"
        b"cted_seconds_total Total time spent generating tokens\n# TYPE llamacpp:tokens_predicted_s"
        b"econds_total counter\nllamacpp:tokens_predicted_seconds_total 0\n# HELP llamacpp:n_dec"
        b"ode_total Total number of llama_decode() calls, excluding speculative decoding and multi"
        b"modal decoding\n# TYPE llamacpp:n_decode_total counter\nllamacpp:n_decode_total 0\n# HE"
        b"LP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)\n# TYPE l"
        b"lamacpp:n_tokens_max counter\nllamacpp:n_tokens_max 0\n# HELP llamacpp:spec_decode_num"
        b"_draft_tokens_total Speculative: Total draft tokens generated\n# TYPE llamacpp:spec_decod"
        b"e_num_draft_tokens_total counter\nllamacpp:spec_decode_num_draft_tokens_total 0\n# HEL"
        b"P llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepte"
        b"d by the target model\n# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter\n"
        b"llamacpp:spec_decode_num_accepted_tokens_total 0\n# HELP llamacpp:spec_decode_num_drafts_"
        b"total Speculative: Total speculative decoding verification steps\n# TYPE llamacpp:spec_de"
        b"code_num_drafts_total counter\nllamacpp:spec_decode_num_drafts_total 0\n# HELP llamacp"
        b"p:prompt_tokens_seconds Average prompt throughput in tokens/s\n# TYPE llamacpp:prompt_tok"
        b"ens_seconds gauge\nllamacpp:prompt_tokens_seconds 0\n# HELP llamacpp:predicted_tokens_"
        b"seconds Average generation throughput in tokens/s\n# TYPE llamacpp:predicted_tokens_secon"
        b"ds gauge\nllamacpp:predicted_tokens_seconds 0\n# HELP llamacpp:requests_processing Num"
        b"ber of requests processing\n# TYPE llamacpp:requests_processing gauge\nllamacpp:reques"
        b"ts_processing 0\n# HELP llamacpp:requests_deferred Number of requests deferred\n# TYPE"
        b" llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n# HELP llamacpp:n_bus"
        b"y_slots_per_decode Average number of busy slots per llama_decode() call\n# TYPE llamacpp:"
        b"n_busy_slots_per_decode gauge\nllamacpp:n_busy_slots_per_decode 0\n",
    ),
    "models": (
        200,
        "application/json; charset=utf-8",
        b'{"models":[{"name":"{model}","model":"{model}","modified_at":"","size":"","digest":"","type"'
        b':"model","description":"","tags":[""],"capabilities":["completion"],"parameters":"","details'
        b'":{"parent_model":"","format":"gguf","family":"","families":[""],"parameter_size":"","quanti'
        b'zation_level":""}}],"object":"list","data":[{"id":"{model}","aliases":["{model}"],"tags":[],'
        b'"object":"model","created":1796236434,"owned_by":"llamacpp","meta":{"vocab_type":1,"n_vocab"'
        b':32000,"n_ctx":512,"n_ctx_train":512,"n_embd":64,"n_params":4178240,"size":16712960,"ftype":'
        b'"all F32"}}]}',
    ),
    "props": (
        200,
        "application/json; charset=utf-8",
        b'{"default_generation_settings":{"params":{"seed":17,"temperature":0.800000011920929,"dynatemp_ra'
        b'nge":0.0,"dynatemp_exponent":1.0,"top_k":40,"top_p":0.949999988079071,"min_p":0.0500000007450580'
        b'6,"top_n_sigma":-1.0,"xtc_probability":0.0,"xtc_threshold":0.10000000149011612,"typical_p":1.0,"'
        b'repeat_last_n":64,"repeat_penalty":1.0,"presence_penalty":0.0,"frequency_penalty":0.0,"dry_multi'
        b'plier":0.0,"dry_base":1.75,"dry_allowed_length":2,"dry_penalty_last_n":64,"mirostat":0,"mirostat'
        b'_tau":5.0,"mirostat_eta":0.10000000149011612,"adaptive_target":-1.0,"adaptive_decay":0.899999976'
        b'1581421,"max_tokens":-1,"n_predict":-1,"n_keep":0,"n_discard":0,"ignore_eos":false,"stream":fals'
        b'e,"n_probs":0,"min_keep":0,"chat_format":"Content-only","reasoning_format":"none","reasoning_in_'
        b'content":false,"generation_prompt":"","samplers":["penalties","dry","top_n_sigma","top_k","typ_p'
        b'","top_p","min_p","xtc","temperature"],"speculative.types":"none","timings_per_token":false,"pos'
        b't_sampling_probs":false,"backend_sampling":false,"lora":[]},"n_ctx":512},"total_slots":2,"model_'
        b'alias":"{model}","model_ftype":"all F32","model_path":"/models/tiny.gguf","modalities":{"vision"'
        b':false,"video":false,"audio":false},"media_marker":"<__media_XdGOw9KkKD56RXxCQiDUUGctdlasUQY5__>'
        b'","endpoint_slots":true,"endpoint_props":false,"endpoint_metrics":true,"ui":true,"ui_settings":{'
        b'},"chat_template":"{%- for message in messages -%}\\n  {{- \'<|im_start|>\' + message.role '
        b"+ '\\n' + message.content + '<|im_end|>\\n' -}}\\n{%- endfor -%}\\n{%- if add_generation_prompt "
        b'-%}\\n  {{- \'<|im_start|>assistant\\n\' -}}\\n{%- endif -%}","chat_template_caps":{"supports'
        b'_object_arguments":false,"supports_parallel_tool_calls":false,"supports_preserve_reasoning":fals'
        b'e,"supports_reasoning_effort":false,"supports_string_content":true,"supports_system_role":true,"'
        b'supports_tool_calls":false,"supports_tools":false,"supports_typed_content":false},"bos_token":"<'
        b's>","eos_token":"</s>","build_info":"b1-0c1e570","is_sleeping":false,"cors_proxy_enabled":false}',
    ),
    "props_no_slots": (
        200,
        "application/json; charset=utf-8",
        b'{"default_generation_settings":{"params":{"seed":17,"temperature":0.800000011920929,'
        b'"dynatemp_range":0.0,"dynatemp_exponent":1.0,"top_k":40,"top_p":0.949999988079071,"m'
        b'in_p":0.05000000074505806,"top_n_sigma":-1.0,"xtc_probability":0.0,"xtc_threshold":0'
        b'.10000000149011612,"typical_p":1.0,"repeat_last_n":64,"repeat_penalty":1.0,"presence'
        b'_penalty":0.0,"frequency_penalty":0.0,"dry_multiplier":0.0,"dry_base":1.75,"dry_allo'
        b'wed_length":2,"dry_penalty_last_n":64,"mirostat":0,"mirostat_tau":5.0,"mirostat_eta"'
        b':0.10000000149011612,"adaptive_target":-1.0,"adaptive_decay":0.8999999761581421,"max'
        b'_tokens":-1,"n_predict":-1,"n_keep":0,"n_discard":0,"ignore_eos":false,"stream":fals'
        b'e,"n_probs":0,"min_keep":0,"chat_format":"Content-only","reasoning_format":"none","r'
        b'easoning_in_content":false,"generation_prompt":"","samplers":["penalties","dry","top'
        b'_n_sigma","top_k","typ_p","top_p","min_p","xtc","temperature"],"speculative.types":"'
        b'none","timings_per_token":false,"post_sampling_probs":false,"backend_sampling":false'
        b',"lora":[]},"n_ctx":512},"total_slots":4,"model_alias":"{model}","model_ftype":"all '
        b'F32","model_path":"/models/tiny.gguf","modalities":{"vision":false,"video":false,"au'
        b'dio":false},"media_marker":"<__media_M1Hr1pmsqY07psaY8ThOWq8RUUutUxB6__>","endpoint_'
        b'slots":false,"endpoint_props":false,"endpoint_metrics":true,"ui":true,"ui_settings":'
        b'{},"chat_template":"{%- for message in messages -%}\\n  {{- \'<|im_start|>\' + message.'
        b"role + '\\n' + message.content + '<|im_end|>\\n' -}}\\n{%- endfor -%}\\n{%- if add_g"
        b"eneration_prompt -%}\\n  {{- '<|im_start|>assistant\\n' -}}\\n{%- endif -%}\",\"chat_"
        b'template_caps":{"supports_object_arguments":false,"supports_parallel_tool_calls":fal'
        b'se,"supports_preserve_reasoning":false,"supports_reasoning_effort":false,"supports_s'
        b'tring_content":true,"supports_system_role":true,"supports_tool_calls":false,"support'
        b's_tools":false,"supports_typed_content":false},"bos_token":"<s>","eos_token":"</s>",'
        b'"build_info":"b1-0c1e570","is_sleeping":false,"cors_proxy_enabled":false}',
    ),
    "slots_busy": (
        200,
        "application/json; charset=utf-8",
        b'[{"id":0,"n_ctx":512,"speculative":false,"is_processing":true,"id_task":5,"n_prompt_toke'
        b'ns":207,"n_prompt_tokens_processed":29,"n_prompt_tokens_cache":0,"params":{"seed":17,"te'
        b'mperature":0.800000011920929,"dynatemp_range":0.0,"dynatemp_exponent":1.0,"top_k":40,"to'
        b'p_p":0.949999988079071,"min_p":0.05000000074505806,"top_n_sigma":-1.0,"xtc_probability":'
        b'0.0,"xtc_threshold":0.10000000149011612,"typical_p":1.0,"repeat_last_n":64,"repeat_penal'
        b'ty":1.0,"presence_penalty":0.0,"frequency_penalty":0.0,"dry_multiplier":0.0,"dry_base":1'
        b'.75,"dry_allowed_length":2,"dry_penalty_last_n":64,"mirostat":0,"mirostat_tau":5.0,"miro'
        b'stat_eta":0.10000000149011612,"adaptive_target":-1.0,"adaptive_decay":0.8999999761581421'
        b',"max_tokens":400,"n_predict":400,"n_keep":0,"n_discard":0,"ignore_eos":false,"stream":f'
        b'alse,"n_probs":0,"min_keep":0,"chat_format":"peg-native","reasoning_format":"deepseek","'
        b'reasoning_in_content":false,"generation_prompt":"<|im_start|>assistant\\n","samplers":["p'
        b'enalties","dry","top_n_sigma","top_k","typ_p","top_p","min_p","xtc","temperature"],"spec'
        b'ulative.types":"none","timings_per_token":false,"post_sampling_probs":false,"backend_sam'
        b'pling":false,"lora":[]},"next_token":[{"has_next_token":true,"has_new_line":false,"n_rem'
        b'ain":222,"n_decoded":178}]},{"id":1,"n_ctx":512,"speculative":false,"is_processing":true'
        b',"id_task":7,"n_prompt_tokens":206,"n_prompt_tokens_processed":29,"n_prompt_tokens_cache'
        b'":0,"params":{"seed":17,"temperature":0.800000011920929,"dynatemp_range":0.0,"dynatemp_e'
        b'xponent":1.0,"top_k":40,"top_p":0.949999988079071,"min_p":0.05000000074505806,"top_n_sig'
        b'ma":-1.0,"xtc_probability":0.0,"xtc_threshold":0.10000000149011612,"typical_p":1.0,"repe'
        b'at_last_n":64,"repeat_penalty":1.0,"presence_penalty":0.0,"frequency_penalty":0.0,"dry_m'
        b'ultiplier":0.0,"dry_base":1.75,"dry_allowed_length":2,"dry_penalty_last_n":64,"mirostat"'
        b':0,"mirostat_tau":5.0,"mirostat_eta":0.10000000149011612,"adaptive_target":-1.0,"adaptiv'
        b'e_decay":0.8999999761581421,"max_tokens":400,"n_predict":400,"n_keep":0,"n_discard":0,"i'
        b'gnore_eos":false,"stream":false,"n_probs":0,"min_keep":0,"chat_format":"peg-native","rea'
        b'soning_format":"deepseek","reasoning_in_content":false,"generation_prompt":"<|im_start|>'
        b'assistant\\n","samplers":["penalties","dry","top_n_sigma","top_k","typ_p","top_p","min_p"'
        b',"xtc","temperature"],"speculative.types":"none","timings_per_token":false,"post_samplin'
        b'g_probs":false,"backend_sampling":false,"lora":[]},"next_token":[{"has_next_token":true,'
        b'"has_new_line":false,"n_remain":223,"n_decoded":177}]}]',
    ),
    "slots_disabled": (
        501,
        "application/json; charset=utf-8",
        b'{"error":{"code":501,"message":"This server does not support slots endpoint. Start i'
        b't with `--slots`","type":"not_supported_error"}}',
    ),
    "slots_idle": (
        200,
        "application/json; charset=utf-8",
        b'[{"id":0,"n_ctx":512,"speculative":false,"is_processing":false},{"id":1,"n_ctx":512,"spe'
        b'culative":false,"is_processing":false}]',
    ),
}
