() => {
    // A file dropped on the message box or the conversation is attached, as the attach
    // button's picker would (page_edges.js then names any kind not taken). Elsewhere a drop
    // does nothing: the browser must not open the file in place of the page.
    const input = () => document.querySelector("#attach-row input[type=file]");
    const target = (event) => event.target.closest?.("#message, #chatbot, #attached");
    const files = (event) => [...(event.dataTransfer?.types || [])].includes("Files");
    document.addEventListener("dragover", (event) => {
        if (!files(event)) return;
        event.preventDefault();
        event.dataTransfer.dropEffect = target(event) && input() ? "copy" : "none";
        document.body.classList.toggle("reame-dropping", Boolean(target(event)));
    });
    document.addEventListener("dragleave", (event) => {
        if (!event.relatedTarget) document.body.classList.remove("reame-dropping");
    });
    document.addEventListener("drop", (event) => {
        if (!files(event)) return;
        event.preventDefault();
        document.body.classList.remove("reame-dropping");
        const picker = input();
        if (!target(event) || !picker || !event.dataTransfer.files.length) return;
        const dropped = new DataTransfer();
        for (const file of event.dataTransfer.files) dropped.items.add(file);
        picker.files = dropped.files;
        picker.dispatchEvent(new Event("change", {bubbles: true}));
    });
}
