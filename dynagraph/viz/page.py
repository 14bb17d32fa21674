"""One self-contained HTML page: inline SVG panels, inline CSS and JS, no server, no CDN.

A page has one step slider (#dg-step) with buttons (#dg-first, #dg-prev, #dg-next,
#dg-last). Step k highlights, in every panel that has a step k, the nodes of that step's
batch (class "running"), the nodes it reads (class "read") and the edges between them
("active"); earlier batches are filled in ("done"), later ones greyed ("pending"). Each
panel carries its steps as JSON in a <script type="application/json" data-for=panel id>:
[[node ids of the batch], [node ids it reads], "caption"], one entry per step.
#dg-info names the highlighted batch of each panel, and carries data-step.
"""
from __future__ import annotations

import json
import os
import tempfile
from html import escape
from typing import Sequence

CSS = """
body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:12px;color:#222}
h1{font-size:18px;margin:4px 0} .dg-note{font-size:13px;color:#444;max-width:70em}
#dg-controls{position:sticky;top:0;background:#fff;padding:6px 0;z-index:2;border-bottom:1px solid #ddd}
#dg-controls button{font-size:13px;margin-right:2px} #dg-step{width:420px;vertical-align:middle}
#dg-info{font-size:13px;margin-top:4px;white-space:pre-wrap;font-family:DejaVu Sans Mono,monospace}
.dg-panels{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start}
.dg-box{border:1px solid #ccc;border-radius:6px;padding:4px}
.dg-caption{font-size:12px;color:#333;margin:2px 4px;font-family:DejaVu Sans Mono,monospace}
.node.pending rect{fill:#f1f1f1;stroke:#bbb} .node.pending text{fill:#999}
.node.running rect{stroke:#000;stroke-width:3.5}
.node.read rect{stroke:#d62728;stroke-width:3;stroke-dasharray:5 2}
.dg-step-item.current>rect.dg-row{fill:#fff3b0} .edge.active{stroke:#d62728;stroke-width:2.4}
table.dg{border-collapse:collapse;font-size:13px;margin:6px 0} table.dg td,table.dg th{border:1px solid #ccc;padding:2px 8px}
"""

JS = r"""
(function(){
  const panels=[...document.querySelectorAll('script[type="application/json"][data-for]')].map(s=>({
    svg:document.getElementById(s.dataset.for), steps:JSON.parse(s.textContent), name:s.dataset.name||s.dataset.for}));
  const slider=document.getElementById('dg-step'), info=document.getElementById('dg-info');
  const n=Math.max(1,...panels.map(p=>p.steps.length));
  slider.min=0; slider.max=n-1;
  function show(k){
    k=Math.max(0,Math.min(n-1,k|0)); slider.value=k; const lines=[];
    for(const p of panels){
      const step=p.steps[k], run=new Set(step?step[0]:[]), read=new Set(step?step[1]:[]);
      for(const g of p.svg.querySelectorAll('.node')){
        const b=+g.dataset.batch, id=+g.dataset.node;
        g.classList.toggle('running',run.has(id));
        g.classList.toggle('read',read.has(id));
        g.classList.toggle('done',step?b<k:true);
        g.classList.toggle('pending',step?b>k:false);
      }
      for(const e of p.svg.querySelectorAll('.edge'))
        e.classList.toggle('active',run.has(+e.dataset.to)&&read.has(+e.dataset.from));
      for(const r of p.svg.querySelectorAll('.dg-step-item')) r.classList.toggle('current',+r.dataset.batch===k);
      p.svg.dataset.highlight=step?k:-1;
      lines.push(p.name+': '+(step?step[2]:'finished ('+p.steps.length+' batches)'));
    }
    info.dataset.step=k;
    info.textContent='step '+k+' of '+n+'\n'+lines.join('\n');
  }
  slider.addEventListener('input',()=>show(+slider.value));
  const go={'dg-first':()=>0,'dg-prev':()=>+slider.value-1,'dg-next':()=>+slider.value+1,'dg-last':()=>n-1};
  for(const id in go) document.getElementById(id).addEventListener('click',()=>show(go[id]()));
  document.addEventListener('keydown',e=>{if(e.target===slider)return; // the slider steps itself
    if(e.key==='ArrowRight')show(+slider.value+1);
    if(e.key==='ArrowLeft')show(+slider.value-1);});
  show(0);
})();
"""


def steps_json(steps: Sequence[tuple]) -> str:
    """JSON safe inside <script>: '</' cannot close the element."""
    return json.dumps([[list(a), list(b), c] for a, b, c in steps]).replace("</", "<\\/")


def page(title: str, note: str, panels: Sequence[tuple[str, str, str, Sequence[tuple]]], extra: str = "") -> str:
    """panels: (panel id, display name, panel html (an <svg> and anything around it), steps)."""
    body = []
    for pid, name, html, steps in panels:
        body.append(f'<div class="dg-box">{html}'
                    f'<script type="application/json" data-for="{escape(pid)}" data-name="{escape(name)}">'
                    f'{steps_json(steps)}</script></div>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class=\"dg-note\">{note}</p>{extra}"
            '<div id="dg-controls"><button id="dg-first">|&lt;</button><button id="dg-prev">&lt; step</button>'
            '<input id="dg-step" type="range" min="0" max="0" step="1" value="0">'
            '<button id="dg-next">step &gt;</button><button id="dg-last">&gt;|</button>'
            '<div id="dg-info" data-step="0"></div></div>'
            f'<div class="dg-panels">{"".join(body)}</div><script>{JS}</script></body></html>\n')


def write_atomic(path: str, text: str) -> str:
    """Write via a temporary file in the same folder and rename: a reader never sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".dgviz-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes the file private; the result is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
